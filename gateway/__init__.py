"""The gateway harnesses call: OpenAI- and Anthropic-compatible APIs in front of the inference engines, recording
every call on tether.calls before the harness gets its answer.

`api/` holds the APIs a harness speaks (wire models, answer writers, routes),
`http/` what every router shares, `routes/` the gateway's own routes;
`service.py` is the call path every API takes, with rendering, the rollout
registry, the read-back from the log, the pause gate and the recorder beside it.
"""
