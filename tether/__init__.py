"""Tether's front: the `tether` command (`cli/`), the local stack it starts (`stack.py`), the demo job (`demo.py`)
and the tiny random model the demo, benchmarks and tests run on (`tiny_model.py`)."""
