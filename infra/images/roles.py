"""The images Tether ships, one per role: what each installs and runs, written once.

Each image holds the project's wheel with its role's extras (pyproject.toml),
so the gateway, processors and controller carry no torch or CUDA libraries;
the trainer's image also serves the embedded engine. `Containerfile` has a
target and an install stage per role (tests/test_images.py holds it to this
table).
"""

from __future__ import annotations

from dataclasses import dataclass

# What the images and the manifests (infra/k8s) share: the user, the working directory, the ports, the files
USER_ID = 10001  # the images' user (the Containerfile's USER), the pods' runAsUser
STATE_DIR = "/var/lib/tether"  # its home and working directory: relative `.tether/` paths land here
GATEWAY_PORT = 8000
ENGINE_PORT = 8100
KAFKA_PORT = 9092
RUN_DIR = "/etc/tether/run"  # the controller's run file, mounted
TRAINER_DIR = "/etc/tether/trainer"  # the trainer's YAML, mounted


@dataclass(frozen=True)
class Role:
    name: str  # the Containerfile's target, and the image is tether-<name>
    extras: tuple[str, ...]  # the wheel's extras it installs beside the core dependencies
    packages: tuple[str, ...]  # what it runs: these import with none of the other roles' extras installed
    command: tuple[str, ...]  # what it runs by default (the manifests run the same)
    port: int | None = None  # where it serves HTTP, if it does

    @property
    def image(self) -> str:
        """Its image's name, without registry or tag."""
        return f"tether-{self.name}"


ROLES: tuple[Role, ...] = (
    Role("gateway", (), ("gateway",), ("tether", "gateway", "serve"), GATEWAY_PORT),
    Role("processors", ("processors",), ("stream_processors",), ("tether", "processors", "run")),
    Role("controller", ("controller",), ("controller", "swe"),
         ("tether", "controller", "run", f"{RUN_DIR}/run.yaml")),
    Role("trainer", ("trainer",), ("trainer", "engine"),
         ("tether", "trainer", "run", f"{TRAINER_DIR}/trainer.yaml"), ENGINE_PORT),
    # the controller with the example agent's SDK, for a run whose harnesses run beside it (its local runner): the
    # demo from the images (the agent's file is mounted)
    Role("agents", ("controller", "demo"), ("controller",), ("tether", "controller", "run", f"{RUN_DIR}/run.yaml")),
    # the broker, for a stack run from the images on one machine (its install stage is the gateway's: the core)
    Role("kafka", (), ("infra",), ("tether", "kafka", "serve"), KAFKA_PORT),
)
BY_NAME = {r.name: r for r in ROLES}


@dataclass(frozen=True)
class StepImage:
    """An image of a coding task's pod (examples/swe/job-template.yaml): one of its steps, not a service, so no
    port and no health check; the Job's outcome is its exit."""

    name: str  # the Containerfile's target, and the image is tether-<name>
    holds: str  # what it holds, and what it must not

    @property
    def image(self) -> str:
        return f"tether-{self.name}"


SWE_TASKS = StepImage("swe-tasks", "`tether swe` (checkout, grade) with git and pytest, and the tasks "
                      "`tether swe build` wrote, grading data included")
SWE_AGENT = StepImage("swe-agent", "mini-swe-agent, pytest and git, the versions of the lock; no tasks and no Tether")
STEP_IMAGES: tuple[StepImage, ...] = (SWE_TASKS, SWE_AGENT)
TASKS_DIR = "/tasks"  # where the tasks image holds the tasks (the Job template's --tasks)
MINI_CONFIG = "/etc/tether/mini.yaml"  # examples/mini_swe_agent/tether.yaml in the agent's image
