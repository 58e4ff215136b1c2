"""What a started cluster needs before Tether uses it: the ACL table applied, the topic catalogue created.

Both run as the `admin` super user and are idempotent (an ACL or topic that exists is left as it is), so every
`tether kafka up` provisions again. aiokafka's admin client has no ACL calls; its protocol has the
CreateAcls request, sent here through a plain AIOKafkaClient.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka.client import AIOKafkaClient
from aiokafka.protocol.admin import CreateAclsRequest

from infra.errors import BrokerStartFailed
from infra.kafka.acls import SERVICES, Acl
from schemas.admin import admin_client, ensure_topics
from schemas.security import client_kwargs
from schemas.settings import BusSettings

# Kafka's wire codes (org.apache.kafka.common.acl / resource).
RESOURCE_TYPE = {"topic": 2, "group": 3, "cluster": 4}
PATTERN_TYPE = {"literal": 3, "prefix": 4}
OPERATION = {"Read": 3, "Write": 4, "Create": 5, "Describe": 8, "DescribeConfigs": 10}
ALLOW = 3
ANY_HOST = "*"


def bindings() -> list[tuple[str, Acl, str]]:
    """(principal, ACL, one operation) for every grant of the table: Kafka takes one operation per binding."""
    return [(user.principal, acl, op) for user in SERVICES for acl in user.acls for op in acl.operations]


async def apply_acls(settings: BusSettings) -> int:
    """Create every binding of the ACL table; the number of bindings."""
    client = AIOKafkaClient(bootstrap_servers=settings.bootstrap_servers, client_id=settings.client_id,
                            request_timeout_ms=settings.request_timeout_ms, **client_kwargs(settings))
    try:
        await client.bootstrap()
        node = client.get_random_node()
        requests = [CreateAclsRequest(RESOURCE_TYPE[acl.resource], acl.name, PATTERN_TYPE[acl.pattern], principal,
                                      ANY_HOST, OPERATION[op], ALLOW) for principal, acl, op in bindings()]
        responses = await asyncio.gather(*(client.send(node, request) for request in requests))
    finally:
        await client.close()
    for (principal, acl, op), response in zip(bindings(), responses, strict=True):
        for code, message in response.creation_responses:
            if code != 0:
                raise BrokerStartFailed(f"granting {principal} {op} on {acl.resource} {acl.name} failed with Kafka "
                                        f"error {code}: {message}")
    return len(requests)


async def provision(settings: BusSettings, acls: bool) -> None:
    """ACLs first (services may connect as soon as their topics exist), then the catalogue."""
    if acls:
        await apply_acls(settings)
    await ensure_topics(settings)


async def describe_cluster(settings: BusSettings) -> dict[str, Any]:
    """The cluster id and the registered brokers, as the admin API reports them."""
    async with admin_client(settings) as admin:
        found: dict[str, Any] = await admin.describe_cluster()
        return found
