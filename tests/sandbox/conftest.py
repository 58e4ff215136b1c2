"""The sandbox's fixtures: bubblewrap present, the stand-in servers, a run's folder as the swe example lays
it out."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sandbox.support import Server


@pytest.fixture(scope="session", autouse=True)
def _bubblewrap() -> None:
    if shutil.which("bwrap") is None:
        pytest.fail("bubblewrap is not installed: `make setup` installs it (Debian: apt-get install bubblewrap)")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Server, Server]]:
    gateway, other = Server("gateway"), Server("elsewhere")
    yield gateway, other
    gateway.close()
    other.close()


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A run's folder as the swe example lays it out: tasks (private), two rollouts' copies."""
    (tmp_path / "tasks" / "private").mkdir(parents=True)
    (tmp_path / "tasks" / "private" / "instances.jsonl").write_text("the gold patch\n")
    for rollout in ("mine", "other"):
        (tmp_path / "work" / rollout).mkdir(parents=True)
        (tmp_path / "work" / rollout / "code.py").write_text(f"# {rollout}\n")
    return tmp_path
