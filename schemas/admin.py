"""Idempotent topic creation from the catalogue, through Kafka's admin API."""

from __future__ import annotations

from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from schemas.errors import TopicSetupError
from schemas.settings import BusSettings
from schemas.topics import CATALOGUE, Topic

TOPIC_ALREADY_EXISTS = 36


async def ensure_topics(settings: BusSettings, catalogue: Sequence[Topic] = CATALOGUE) -> list[str]:
    """Create the missing topics; return their names. Existing topics must have the catalogue's partitions."""
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers,
        client_id=f"{settings.client_id}-admin",
        request_timeout_ms=settings.request_timeout_ms,
    )
    try:
        await admin.start()
        existing = set(await admin.list_topics())
        wanted = [t for t in catalogue if t.name not in existing]
        created: list[str] = []
        if wanted:
            response = await admin.create_topics(
                [NewTopic(t.name, t.partitions, settings.replication_factor, topic_configs=t.config) for t in wanted]
            )
            for name, code, *rest in response.topic_errors:
                if code == 0:
                    created.append(name)
                elif code != TOPIC_ALREADY_EXISTS:
                    message = rest[0] if rest else ""
                    raise TopicSetupError(f"creating {name} failed with Kafka error {code}: {message}")
        described = await admin.describe_topics([t.name for t in catalogue])
    except KafkaError as exc:
        raise TopicSetupError(f"topic setup on {settings.bootstrap_servers} failed: {exc!r}") from exc
    finally:
        await admin.close()
    partitions = {d["topic"]: len(d["partitions"]) for d in described}
    for topic in catalogue:
        if topic.name in existing and partitions.get(topic.name) != topic.partitions:
            raise TopicSetupError(
                f"{topic.name} exists with {partitions.get(topic.name)} partitions, the catalogue says "
                f"{topic.partitions}: keys would land on other partitions"
            )
    return created
