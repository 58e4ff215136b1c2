"""The embedded inference engine: a vLLM-compatible `/v1/completions` server over a Hugging Face model.

Its own process (`tether engine serve`), which imports nothing from the
trainer: it loads each weight version the trainer publishes from a staged
checkpoint (`POST /v1/weights/load`), batches concurrent requests step by
step over a KV cache, and stamps every response with the weight version that
produced it.
"""
