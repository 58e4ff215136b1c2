"""The HTTP boundary every router shares: errors in the caller's protocol (`refusals.py`), the service as a
dependency (`deps.py`), who is calling (`auth.py`), the body as sent (`body.py`)."""
