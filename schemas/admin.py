"""Idempotent topic creation from the catalogue, through Kafka's admin API.

Topics get the replication factor BusSettings asks for, or by default as many copies as the cluster has
brokers (at most 3), with min.insync.replicas=2 once there are 3, so that an acknowledged event is on two
brokers at least and one broker may be down.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAuthorizationFailedError

from schemas.access import not_authorized, refusal
from schemas.errors import TopicSetupError
from schemas.security import client_kwargs
from schemas.settings import BusSettings, min_insync_replicas
from schemas.topics import CATALOGUE, Topic

TOPIC_ALREADY_EXISTS = 36
MAX_REPLICATION = 3


@contextlib.asynccontextmanager
async def admin_client(settings: BusSettings) -> AsyncIterator[AIOKafkaAdminClient]:
    """A started admin client as `settings` say, closed after; refusals become the project's errors."""
    client_id = f"{settings.client_id}-admin"
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=client_id,
        request_timeout_ms=settings.request_timeout_ms,
        **client_kwargs(settings),
    )
    try:
        await admin.start()
        yield admin
    except KafkaError as exc:
        denied = await refusal(exc, settings, client_id, "describe")
        raise denied or TopicSetupError(f"topic setup on {settings.bootstrap_servers} failed: {exc!r}") from exc
    finally:
        await admin.close()


async def replication_factor(admin: AIOKafkaAdminClient, settings: BusSettings) -> int:
    """The factor asked for, or the cluster's broker count up to 3."""
    if settings.replication_factor is not None:
        return settings.replication_factor
    cluster: dict[str, Any] = await admin.describe_cluster()
    return max(1, min(MAX_REPLICATION, len(cluster["brokers"])))


async def ensure_topics(settings: BusSettings, catalogue: Sequence[Topic] = CATALOGUE) -> list[str]:
    """Create the missing topics; return their names. Existing topics must have the catalogue's partitions."""
    async with admin_client(settings) as admin:
        existing = set(await admin.list_topics())
        wanted = [t for t in catalogue if t.name not in existing]
        created: list[str] = []
        if wanted:
            factor = await replication_factor(admin, settings)
            durability = {"min.insync.replicas": str(min_insync_replicas(factor))}
            response = await admin.create_topics(
                [NewTopic(t.name, t.partitions, factor, topic_configs={**t.config, **durability}) for t in wanted]
            )
            for name, code, *rest in response.topic_errors:
                if code == 0:
                    created.append(name)
                elif code == TopicAuthorizationFailedError.errno:
                    raise not_authorized(settings, f"{settings.client_id}-admin", "create", f"topic {name}")
                elif code != TOPIC_ALREADY_EXISTS:
                    message = rest[0] if rest else ""
                    raise TopicSetupError(f"creating {name} failed with Kafka error {code}: {message}")
        described = await admin.describe_topics([t.name for t in catalogue])
    partitions = {d["topic"]: len(d["partitions"]) for d in described}
    for topic in catalogue:
        if topic.name in existing and partitions.get(topic.name) != topic.partitions:
            raise TopicSetupError(
                f"{topic.name} exists with {partitions.get(topic.name)} partitions, the catalogue says "
                f"{topic.partitions}: keys would land on other partitions"
            )
    return created
