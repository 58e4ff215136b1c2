"""`tether engine serve`: the embedded inference engine."""

from __future__ import annotations

from typing import Annotated

import typer

from tether.cli.support import fail, load_settings

engine_app = typer.Typer(help="The embedded inference engine (vLLM-compatible completions).", no_args_is_help=True)


@engine_app.command("serve")
def engine_serve(
    model: Annotated[str | None, typer.Option(help="Model directory or Hugging Face name.")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu, cuda, cuda:N.")] = None,
) -> None:
    """Serve a model on /v1/completions until interrupted."""
    from engine.serve import serve
    from engine.settings import EngineSettings

    settings = load_settings(EngineSettings, model=model, host=host, port=port, device=device)
    try:
        serve(settings)
    except OSError as exc:
        fail(f"cannot load model {settings.model!r}: {str(exc).splitlines()[0]}")
