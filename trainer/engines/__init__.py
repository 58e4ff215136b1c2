"""The trainer's side of the inference engines: each new weight version handed to every replica in its own API.

    base.py       what one replica is asked (`Replica`), the buckets of tensors a broadcast carries
    tether.py     the embedded engine     vllm.py    vLLM's RL API     sglang.py    SGLang's weight API
    broadcast.py  the seam of the distributed path (the trainer's end of the collective group)
    fleet.py      the replicas as one: the hand-over's phases, the rollback, restarted replicas brought up

`tests/test_engine_handover.py` holds the three to one contract, the vLLM and
SGLang ones through fakes that speak their wire format (`tests/fakes/`).
"""
