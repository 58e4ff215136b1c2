"""`tether gateway serve`: the API harnesses call; it records every call."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli.support import fail, failing_cleanly, load_settings

gateway_app = typer.Typer(help="The gateway harnesses call (OpenAI and Anthropic APIs); records every call.",
                          no_args_is_help=True)


@gateway_app.command("serve")
def gateway_serve(
    engine: Annotated[list[str] | None, typer.Option(help="Engine URL (repeat for several).")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="Model directory (tokenizer and chat template).")] = None,
    host: Annotated[str | None, typer.Option()] = None,
    port: Annotated[int | None, typer.Option()] = None,
    run_id: Annotated[str | None, typer.Option(help="The run whose control events this gateway follows.")] = None,
) -> None:
    """Serve the harness APIs until interrupted (settings: TETHER_GATEWAY_*, Kafka: TETHER_BUS_*)."""
    from gateway.serve import serve
    from gateway.settings import DevelopmentKeysExposed, GatewaySettings

    settings = load_settings(GatewaySettings, engines=engine or None, tokenizer=tokenizer, host=host, port=port,
                             run_id=run_id)
    try:
        settings.check_exposure()
    except DevelopmentKeysExposed as exc:
        fail(str(exc), 2)
    if not (settings.tokenizer / "tokenizer.json").is_file():
        fail(f"--tokenizer/TETHER_GATEWAY_TOKENIZER: {settings.tokenizer} has no tokenizer.json"
             " (build a model with `tether model init-tiny`)")
    with failing_cleanly():
        serve(settings)
