"""The APIs a harness speaks, one folder each, as vLLM's OpenAI server lays them out: the wire format's models
(`protocol.py`), the answer writer (`serving.py`, or one per endpoint) and the routes (`router.py`) side by side.

`harness.harness_router` holds them all; the app mounts it twice: at the root (the
rollout comes from the token used as the API key) and under
/rollouts/{rollout_id} (from the path, for harnesses whose base URL can be set
but whose key cannot). Every call takes the same way through `Gateway`
(`serving.serve`); only parsing and the shape of the answer differ.
"""
