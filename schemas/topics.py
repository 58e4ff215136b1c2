"""The topic catalogue: which events go where, keyed by what, kept how long.

Event topics are logs, not tables: they are never compacted (a rollout has many
events under one key) and kept forever by default, since replaying them
rebuilds everything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka.partitioner import murmur2

from schemas import events
from schemas.events import Event

MiB = 1024 * 1024
#: The record header that names an event's run: readers of one run skip the others' records undecoded. Only a
#: hint: records written before it, and by Faust's agents, have none, and are decoded.
RUN_HEADER = "tether-run"


@dataclass(frozen=True)
class Topic:
    name: str
    key_field: str
    partitions: int
    events: tuple[type, ...]
    doc: str
    max_bytes: int
    retention_ms: int = -1  # forever: replay rebuilds everything from these logs
    compacted: bool = False  # a table's changelog: the latest value per key is what counts

    @property
    def config(self) -> dict[str, str]:
        return {"cleanup.policy": "compact" if self.compacted else "delete", "retention.ms": str(self.retention_ms),
                "max.message.bytes": str(self.max_bytes)}


CALLS = Topic(
    "tether.calls", "rollout_id", 8, (events.ModelCall, events.RolloutSealed),
    "every model call, then RolloutSealed after a rollout's last one", max_bytes=8 * MiB,
)
ROLLOUTS = Topic(
    "tether.rollouts", "rollout_id", 8, (events.RolloutStarted, events.RewardReported, events.RolloutFinished),
    "rollout lifecycle from the controller, rewards from harnesses", max_bytes=1 * MiB,
)
SAMPLES = Topic(
    "tether.samples", "group_id", 4, (events.TaskGroup,),
    "task groups assembled by the stream processors", max_bytes=32 * MiB,
)
CONTROL = Topic(
    "tether.control", "run_id", 1,
    (events.UpdateRequested, events.GatewayDrained, events.WeightVersionPublished, events.UpdateAborted,
     events.GatewayJoined, events.GatewayLeft, events.TrainerStep, events.ValidationStarted,
     events.ValidationReported),
    "trainer/gateway update handshake, gateway membership and validation rounds, in one total order",
    max_bytes=1 * MiB,
)
DEADLETTER = Topic(
    "tether.deadletter", "key", 1, (events.DeadLetter,),
    "records no reader could accept, with the reason",
    max_bytes=SAMPLES.max_bytes + 1 * MiB,  # holds the largest record of any topic, whole
    retention_ms=30 * 24 * 3600 * 1000,
)

CATALOGUE: tuple[Topic, ...] = (CALLS, ROLLOUTS, SAMPLES, CONTROL, DEADLETTER)
_BY_EVENT: dict[type, Topic] = {cls: topic for topic in CATALOGUE for cls in topic.events}
BY_NAME: dict[str, Topic] = {topic.name: topic for topic in CATALOGUE}


def topic_for(event: Event) -> Topic:
    return _BY_EVENT[type(event)]


def key_for(event: Event) -> bytes | None:
    """The record key: the topic's key field, so one rollout/group/run stays on one partition."""
    if isinstance(event, events.DeadLetter):
        return event.key
    value: str = getattr(event, topic_for(event).key_field)
    return value.encode()


def partition_for(key: bytes, partitions: int) -> int:
    """Kafka's default placement (Java client's murmur2), so every client in any language agrees."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def run_in_header(headers: Sequence[tuple[str, bytes]] | None) -> str | None:
    """The run a record's header names, if it has one."""
    for name, value in headers or ():
        if name == RUN_HEADER:
            return value.decode(errors="replace")
    return None
