"""The collector's settings for services and bulk readers (schemas.heap)."""

from __future__ import annotations

import gc

import pytest

from schemas.heap import collector_paused


def test_the_collector_is_paused_inside_and_as_it_was_after_even_on_error() -> None:
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a failed read")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
