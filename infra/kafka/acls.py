"""Who may do what on the bus: one Kafka user per service and the ACLs it gets, kept as data.

Each service gets exactly the topics its code reads and writes (`EventConsumer` and `EventProducer` uses, the
processors' Faust topics), and every reader may write tether.deadletter, where it reports records it rejects.
Readers other than the processors assign partitions themselves, so they need no consumer group. The
processors own the topics and the consumer group named by their app id (TETHER_PROCESSOR_APP_ID starts with
PROCESSOR_PREFIX: `tether up` adds the run id), and create those topics themselves.

`admin` is a super user (it creates the catalogue and these ACLs); brokers and controllers are super users
through their certificates. A harness has no user at all: it reaches Kafka only through the gateway.

This table is the one source of truth: `tether kafka up` applies it to the local secured cluster, and it is
written so that Strimzi KafkaUser resources (resource type, name, pattern type, operations) can be generated
from it without another list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from schemas.topics import CALLS, CONTROL, DEADLETTER, ROLLOUTS, SAMPLES

ResourceType = Literal["topic", "group", "cluster"]
PatternType = Literal["literal", "prefix"]
Operation = Literal["Read", "Write", "Create", "Describe", "DescribeConfigs"]

ADMIN = "admin"
PROCESSOR_PREFIX = "tether-processor"  # the default TETHER_PROCESSOR_APP_ID, and what `tether up` extends


@dataclass(frozen=True)
class Acl:
    """Allow `operations` on the resources `name` matches (exactly, or as a prefix), from any host."""

    resource: ResourceType
    name: str
    operations: tuple[Operation, ...]
    pattern: PatternType = "literal"


@dataclass(frozen=True)
class ServiceUser:
    """A service's Kafka user: SCRAM user `name`, principal User:`name`."""

    name: str
    why: str
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    owns: tuple[Acl, ...] = ()

    @property
    def principal(self) -> str:
        return f"User:{self.name}"

    @property
    def acls(self) -> tuple[Acl, ...]:
        """One entry per topic it uses (Read for reading, Write for writing, Describe for either), then what it
        owns."""
        return tuple(self._topic_acl(topic) for topic in dict.fromkeys((*self.reads, *self.writes))) + self.owns

    def _topic_acl(self, topic: str) -> Acl:
        operations: list[Operation] = []
        if topic in self.reads:
            operations.append("Read")
        if topic in self.writes:
            operations.append("Write")
        return Acl("topic", topic, (*operations, "Describe"))

    def may(self, operation: Operation, topic: str) -> bool:
        """Whether the table lets this user do `operation` on `topic`."""
        return any(acl.resource == "topic" and operation in acl.operations
                   and (topic == acl.name if acl.pattern == "literal" else topic.startswith(acl.name))
                   for acl in self.acls)


SERVICES: tuple[ServiceUser, ...] = (
    ServiceUser(
        "gateway", "records every call and seal, and rewards harnesses report; joins, drains and leaves on the "
        "control topic, which it follows; rebuilds a rollout it does not hold from calls and rollouts, and "
        "watches calls for rollouts a peer replica served",
        reads=(CONTROL.name, CALLS.name, ROLLOUTS.name),
        writes=(CALLS.name, ROLLOUTS.name, CONTROL.name, DEADLETTER.name),
    ),
    ServiceUser(
        "controller", "starts and finishes rollouts, rewards from its reward command; follows rollouts and control",
        reads=(ROLLOUTS.name, CONTROL.name),
        writes=(ROLLOUTS.name, DEADLETTER.name),
    ),
    ServiceUser(
        "processors", "joins calls to rollouts, groups them into task groups, sinks every topic to analytics",
        reads=(CALLS.name, ROLLOUTS.name, SAMPLES.name, CONTROL.name),
        writes=(SAMPLES.name, DEADLETTER.name),
        owns=(Acl("topic", PROCESSOR_PREFIX, ("Create", "Read", "Write", "Describe"), "prefix"),
              Acl("group", PROCESSOR_PREFIX, ("Read", "Describe"), "prefix")),
    ),
    ServiceUser(
        "trainer", "learns from task groups; the update handshake and its steps on the control topic",
        reads=(SAMPLES.name, CONTROL.name),
        writes=(CONTROL.name, DEADLETTER.name),
    ),
)
BY_NAME: dict[str, ServiceUser] = {user.name: user for user in SERVICES}
USERS: tuple[str, ...] = (ADMIN, *BY_NAME)
