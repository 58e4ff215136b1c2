"""Rollout tokens bind a harness to its own rollout and nothing else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.rollout_token import Claims, claims, mint, pinned, verify

ids = st.text(min_size=1, max_size=80)
secrets = st.text(st.characters(exclude_characters="\x00"), min_size=1, max_size=40)  # what settings accept


@given(ids, secrets)
def test_a_token_verifies_to_its_rollout(rollout_id: str, secret: str) -> None:
    assert verify(mint(rollout_id, secret), secret) == rollout_id


@given(ids, ids)
def test_a_token_does_not_verify_with_another_secret(rollout_id: str, other: str) -> None:
    token = mint(rollout_id, "the gateway secret")
    assert verify(token, "the gateway secret" + other) is None


@given(ids, ids)
def test_a_token_cannot_be_moved_to_another_rollout(a: str, b: str) -> None:
    prefix, _, issued, signature = mint(a, "s", 1000).split(".")
    forged = mint(b, "s", 1000).split(".")[1]
    assert verify(f"{prefix}.{forged}.{issued}.{signature}", "s") in (None, a if a == b else None)


@given(st.text(max_size=100))
def test_garbage_is_not_a_token(text: str) -> None:
    assert verify(text, "s") is None


@given(ids, st.integers(0, 2**40))
def test_a_token_carries_its_issue_time(rollout_id: str, issued_at: int) -> None:
    assert claims(mint(rollout_id, "s", issued_at), "s") == Claims(rollout_id, issued_at)


@given(ids, st.integers(0, 2**40), st.integers(0, 2**40))
def test_the_issue_time_cannot_be_changed(rollout_id: str, issued_at: int, other: int) -> None:
    prefix, rid, _, signature = mint(rollout_id, "s", issued_at).split(".")
    forged = f"{prefix}.{rid}.{other}.{signature}"
    assert claims(forged, "s") == (Claims(rollout_id, issued_at) if other == issued_at else None)


def test_first_form_tokens_still_verify_without_an_issue_time() -> None:
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    old = f"tr1.{b64(b'r-1')}.{b64(hmac.new(b's', b'r-1', hashlib.sha256).digest())}"
    assert claims(old, "s") == Claims("r-1", None) and verify(old, "s") == "r-1"
    assert verify(old, "another secret") is None


temperatures = st.floats(0.0, 2.0)


@given(ids, st.integers(0, 2**40), temperatures)
def test_a_token_carries_its_pinned_temperature(rollout_id: str, issued_at: int, temperature: float) -> None:
    token = mint(rollout_id, "s", issued_at, temperature=temperature)
    assert claims(token, "s") == Claims(rollout_id, issued_at, pinned(temperature))
    assert abs(pinned(temperature) - temperature) <= 0.0005
    assert claims(token, "another secret") is None


@given(ids, temperatures, st.text(max_size=12))
def test_the_pinned_temperature_cannot_be_changed_or_dropped(rollout_id: str, temperature: float,
                                                              other: str) -> None:
    """A harness holding a greedy validation token cannot sample otherwise, nor pass the token off as a plain one."""
    prefix, rid, issued, milli, signature = mint(rollout_id, "s", 1000, temperature=temperature).split(".")
    changed = claims(f"{prefix}.{rid}.{issued}.{other}.{signature}", "s")
    assert changed is None or (other == milli and changed.temperature == pinned(temperature))
    assert claims(f"tr2.{rid}.{issued}.{signature}", "s") is None
    assert claims(f"{prefix}.{rid}.{issued}.{signature}", "s") is None


@given(ids, st.integers(0, 2**40))
def test_a_plain_token_cannot_be_given_a_temperature(rollout_id: str, issued_at: int) -> None:
    _, rid, issued, signature = mint(rollout_id, "s", issued_at).split(".")
    for milli in ("0", "1000", "700"):
        assert claims(f"tr3.{rid}.{issued}.{milli}.{signature}", "s") is None


def test_only_a_sampling_temperature_can_be_pinned() -> None:
    import pytest

    for bad in (-0.1, 2.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            mint("r-1", "s", 1, temperature=bad)


seeds = st.integers(0, 2**63 - 1)


@given(ids, st.integers(0, 2**40), st.none() | temperatures, seeds)
def test_a_token_carries_its_rollouts_seed(rollout_id: str, issued_at: int, temperature: float | None,
                                           seed: int) -> None:
    token = mint(rollout_id, "s", issued_at, temperature=temperature, seed=seed)
    pin = pinned(temperature) if temperature is not None else None
    assert claims(token, "s") == Claims(rollout_id, issued_at, pin, seed)
    assert claims(token, "another secret") is None


@given(ids, st.none() | temperatures, seeds, st.text(max_size=24))
def test_the_seed_and_the_temperature_of_a_seeded_token_cannot_be_changed_or_dropped(
        rollout_id: str, temperature: float | None, seed: int, other: str) -> None:
    """Every replica derives the rollout's call seeds from the token: a harness cannot choose them by editing it,
    nor unpin its temperature by dropping the seed."""
    prefix, rid, issued, milli, text, signature = mint(rollout_id, "s", 1000, temperature=temperature,
                                                       seed=seed).split(".")
    reseeded = claims(f"{prefix}.{rid}.{issued}.{milli}.{other}.{signature}", "s")
    assert reseeded is None or (other == text and reseeded.seed == seed)
    repinned = claims(f"{prefix}.{rid}.{issued}.{other}.{text}.{signature}", "s")
    assert repinned is None or (other == milli and repinned.seed == seed)
    assert claims(f"tr3.{rid}.{issued}.{milli}.{signature}", "s") is None
    assert claims(f"tr2.{rid}.{issued}.{signature}", "s") is None


@given(ids, st.integers(0, 2**40), st.none() | temperatures, seeds)
def test_a_token_without_a_seed_cannot_be_given_one(rollout_id: str, issued_at: int, temperature: float | None,
                                                    seed: int) -> None:
    parts = mint(rollout_id, "s", issued_at, temperature=temperature).split(".")
    rid, issued, signature, milli = parts[1], parts[2], parts[-1], parts[3] if len(parts) == 5 else ""
    assert claims(f"tr4.{rid}.{issued}.{milli}.{seed}.{signature}", "s") is None


def test_numbers_past_their_bounds_are_refused_not_raised() -> None:
    """Thousands of digits make int() raise; a token that long is no token (a 401, never a 500)."""
    import pytest

    long = "1" * 5000
    token = mint("r-1", "s", 1000, seed=1)
    prefix, rid, issued, milli, seed, signature = token.split(".")
    head = f"{prefix}.{rid}"
    for forged in (f"tr2.{rid}.{long}.{signature}", f"tr3.{rid}.{long}.0.{signature}",
                   f"{head}.{long}.{milli}.{seed}.{signature}", f"{head}.{issued}.{milli}.{long}.{signature}",
                   f"{head}.{issued}.{milli}.{2**63}.{signature}", f"{head}.{issued}.{milli}.01.{signature}",
                   f"{head}.{issued}.{milli}.-1.{signature}", f"{head}.0{issued}.{milli}.{seed}.{signature}"):
        assert claims(forged, "s") is None
    for bad in (-1, 2**63):
        with pytest.raises(ValueError, match="seed"):
            mint("r-1", "s", 1, seed=bad)


@given(ids, st.integers(1, 3))
def test_a_secret_with_a_nul_is_refused_since_hmac_would_take_it_for_a_shorter_one(rollout_id: str, n: int) -> None:
    token = mint(rollout_id, "the gateway secret")
    assert verify(token, "the gateway secret" + "\x00" * n) is None
    with pytest.raises(ValueError, match="NUL"):
        mint(rollout_id, "the gateway secret\x00")


def test_the_settings_that_take_a_secret_refuse_a_nul() -> None:
    from pydantic import ValidationError

    from controller.settings import ControllerSettings
    from gateway.settings import GatewaySettings

    with pytest.raises(ValidationError):
        GatewaySettings(secret="a long secret\x00")
    with pytest.raises(ValidationError):
        ControllerSettings(gateway_secret="a long secret\x00")
    assert GatewaySettings(secret="a long secret").secret == "a long secret"
    assert ControllerSettings(gateway_secret="a long secret").gateway_secret == "a long secret"
