"""The images Tether ships, one per role: what each installs and runs, written once.

Each image holds the project's wheel with its role's extras (pyproject.toml),
so the gateway, processors and controller carry no torch or CUDA libraries;
the trainer's image also serves the embedded engine. `Containerfile` has a
target and an install stage per role (tests/test_images.py holds it to this
table).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Role:
    name: str  # the Containerfile's target, and the image is tether-<name>
    extras: tuple[str, ...]  # the wheel's extras it installs beside the core dependencies
    packages: tuple[str, ...]  # what it runs: these import with none of the other roles' extras installed
    command: tuple[str, ...]  # what it runs by default (the manifests run the same)
    port: int | None = None  # where it serves HTTP, if it does

    @property
    def image(self) -> str:
        return f"tether-{self.name}"


ROLES: tuple[Role, ...] = (
    Role("gateway", (), ("gateway",), ("tether", "gateway", "serve"), 8000),
    Role("processors", ("processors",), ("stream_processors",), ("tether", "processors", "run")),
    Role("controller", ("controller",), ("controller", "swe"),
         ("tether", "controller", "run", "/etc/tether/run/run.yaml")),
    Role("trainer", ("trainer",), ("trainer", "engine"),
         ("tether", "trainer", "run", "/etc/tether/trainer/trainer.yaml"), 8100),
    # the broker, for a stack run from the images on one machine (its install stage is the gateway's: the core)
    Role("kafka", (), ("infra",), ("tether", "kafka", "serve"), 9092),
)
BY_NAME = {r.name: r for r in ROLES}
