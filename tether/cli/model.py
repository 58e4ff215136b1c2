"""`tether model`: the tiny random model the demo, benchmarks and tests run on."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tether.cli.support import console

model_app = typer.Typer(help="Models: build the tiny one the tests and the demo use.", no_args_is_help=True)


@model_app.command("init-tiny")
def model_init_tiny(
    out: Annotated[Path, typer.Option(help="Directory to write the model to (Hugging Face format).")],
    seed: Annotated[int, typer.Option(help="Same seed, byte-identical files.")] = 0,
    context: Annotated[int, typer.Option(min=256, max=1_048_576, help=(
        "Context length in tokens (prompt and answer). Claude Code's and Codex's prompts are 20-30 thousand of "
        "this tokenizer's tokens: give them 32768."))] = 4096,
) -> None:
    """A tiny random Qwen2 model and a byte-level BPE tokenizer trained on a generated corpus."""
    from tether.tiny_model import init_tiny

    with console.status(f"Building the tiny model (seed {seed}, context {context})..."):
        init_tiny(out, seed, context=context)
    typer.echo(f"Tiny model written to {out}", err=True)


@model_app.command("export")
def model_export(
    checkpoint: Annotated[Path, typer.Option(exists=True, file_okay=False, help=(
        "A checkpoint folder (CHECKPOINT_DIR/RUN_ID/vNNNNNN)."))],
    out: Annotated[Path, typer.Option(help="Where to write the plain Hugging Face folder.")],
    base: Annotated[Path | None, typer.Option(exists=True, file_okay=False, help=(
        "The base an adapter was trained on (default: the path its base.json names)."))] = None,
    merge: Annotated[bool, typer.Option("--merge", help=(
        "Merge an adapter into its base (the only export an adapter has)."))] = False,
) -> None:
    """A checkpoint as a plain Hugging Face folder for serving without Tether: an adapter merged into its base
    (--merge), whole weights copied without the trainer's files."""
    import json
    import shutil

    from schemas.adapters import BASE_FILE, is_adapter

    if out.exists() and any(out.iterdir()):
        raise typer.BadParameter(f"{out} exists and is not empty", param_hint="--out")
    if is_adapter(checkpoint):
        if not merge:
            raise typer.BadParameter("the checkpoint holds an adapter: pass --merge to write it with its base",
                                     param_hint="--merge")
        from trainer import lora
        from trainer.errors import CheckpointMismatch

        try:
            named = base or Path(json.loads((checkpoint / BASE_FILE).read_text())["path"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise typer.BadParameter(f"{checkpoint / BASE_FILE} does not name the base ({exc}): give --base",
                                     param_hint="--base") from exc
        try:
            with console.status(f"Merging the adapter into {named}..."):
                lora.merge(checkpoint, named, out)
        except CheckpointMismatch as exc:
            raise typer.BadParameter(str(exc), param_hint="--base") from exc
    else:
        shutil.copytree(checkpoint, out, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("optimizer.pt", "state.json", "*.staging*"))
    typer.echo(f"Exported to {out}", err=True)
