"""`python -m tether.cli`: how the stack, the demo and the tests start a service."""

from tether.cli.main import app

app()
