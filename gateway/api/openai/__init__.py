"""OpenAI's chat completions and (plain text) completions."""
