"""The OpenAI/Anthropic-compatible gateway harnesses talk to; it records every call on tether.calls (issue 4)."""
