"""The wire formats the gateway speaks, as pydantic models, apart from how calls are served.

Requests are validated into these models and turned into the gateway's one
internal `ChatRequest`; responses are built as these models, so a field name
or order is decided here once. Streams (server-sent events) are written by
the serving modules, which reuse these models for the parts they share.
"""
