"""The `tether` command line: `main.py` puts the command groups (one module each) under one command."""

from tether.cli.main import app

__all__ = ["app"]
