"""Rollout tokens bind a harness to its own rollout and nothing else."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas.rollout_token import mint, verify

ids = st.text(min_size=1, max_size=80)


@given(ids, st.text(min_size=1, max_size=40))
def test_a_token_verifies_to_its_rollout(rollout_id: str, secret: str) -> None:
    assert verify(mint(rollout_id, secret), secret) == rollout_id


@given(ids, ids)
def test_a_token_does_not_verify_with_another_secret(rollout_id: str, other: str) -> None:
    token = mint(rollout_id, "the gateway secret")
    assert verify(token, "the gateway secret" + other) is None


@given(ids, ids)
def test_a_token_cannot_be_moved_to_another_rollout(a: str, b: str) -> None:
    prefix, _, signature = mint(a, "s").split(".")
    forged = mint(b, "s").split(".")[1]
    assert verify(f"{prefix}.{forged}.{signature}", "s") in (None, a if a == b else None)


@given(st.text(max_size=100))
def test_garbage_is_not_a_token(text: str) -> None:
    assert verify(text, "s") is None
