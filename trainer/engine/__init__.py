"""The embedded inference engine: a vLLM-compatible `/v1/completions` server over a Hugging Face model.

It shares its model object with the collocated trainer, batches concurrent
requests step by step over a KV cache, and stamps every response with the
weight version that produced it.
"""
