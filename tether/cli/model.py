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
