"""Which other gateways are alive: a lone gateway stops following tether.calls, and reads on when one joins."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.company import Company

LEASE = 30.0


def test_nobody_is_absent_until_the_control_log_is_read() -> None:
    company = Company("me", LEASE)
    assert not company.alone(1000.0)
    company.history_read()
    assert company.alone(1000.0)


def test_its_own_joins_do_not_count() -> None:
    company = Company("me", LEASE)
    company.history_read()
    company.joined("me", 1000.0)
    assert company.alone(1000.0)


def test_another_counts_from_its_join_until_it_leaves() -> None:
    company = Company("me", LEASE)
    company.history_read()
    company.joined("b", 1000.0)
    assert not company.alone(1001.0)
    company.left("b")
    assert company.alone(1001.0)


def test_a_silent_one_counts_for_its_lease_and_heartbeats_extend_it() -> None:
    company = Company("me", LEASE)
    company.history_read()
    company.joined("b", 1000.0)
    company.joined("b", 1020.0)  # its heartbeat
    assert not company.alone(1045.0)
    assert company.alone(1051.0)


def test_a_late_copy_of_an_old_join_does_not_shorten_the_lease() -> None:
    company = Company("me", LEASE)
    company.history_read()
    company.joined("b", 1020.0)
    company.joined("b", 1000.0)
    assert not company.alone(1045.0)


def test_a_live_join_counts_from_its_arrival_whatever_the_others_clock_says() -> None:
    """Another host's clock behind by more than the lease must not make a live gateway look long gone."""
    company = Company("me", LEASE)
    company.history_read()
    company.joined("b", 500.0, now=1000.0)
    assert not company.alone(1020.0)


def test_history_counts_by_the_events_own_time() -> None:
    company = Company("me", LEASE)
    company.joined("b", 100.0)  # read while catching up with the log: a gateway gone long ago
    company.history_read()
    assert company.alone(1000.0)


joins = st.lists(st.tuples(st.sampled_from(["me", "b", "c"]), st.sampled_from(["join", "leave"]),
                           st.floats(0, 200)), max_size=30)


@given(joins, st.floats(0, 300))
def test_alone_exactly_when_no_other_joined_within_the_lease_and_stayed(events: list[tuple[str, str, float]],
                                                                        now: float) -> None:
    """Against the rule read over the whole history, the events in time order."""
    events = sorted(events, key=lambda e: e[2])
    company = Company("me", LEASE)
    company.history_read()
    for gateway_id, kind, at in events:
        if kind == "join":
            company.joined(gateway_id, at)
        else:
            company.left(gateway_id)
    alive = set()
    for gateway_id in ("b", "c"):
        mine = [(kind, at) for g, kind, at in events if g == gateway_id]
        if mine and mine[-1][0] == "join" and now - mine[-1][1] <= LEASE:
            alive.add(gateway_id)
    assert company.alone(now) == (not alive)
