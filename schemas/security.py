"""How every Kafka client of Tether connects: the one place that turns BusSettings' security settings into
aiokafka's keyword arguments (producers, consumers, admin clients; Faust through the same values).

TLS verifies the broker's certificate and host name against `ca_file` (or the system's CAs); SASL logs in as
`username`. Nothing else in the code base builds an SSL context or passes credentials.
"""

from __future__ import annotations

import ssl
from typing import Any

from schemas.settings import BusSettings


def ssl_context(settings: BusSettings) -> ssl.SSLContext | None:
    """The TLS context for SSL/SASL_SSL (None for plaintext): the CA to trust, the client certificate if any."""
    if not settings.tls:
        return None
    context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
    if settings.cert_file is not None and settings.key_file is not None:
        context.load_cert_chain(str(settings.cert_file), str(settings.key_file))
    return context


def client_kwargs(settings: BusSettings) -> dict[str, Any]:
    """aiokafka's security arguments, for AIOKafkaProducer, AIOKafkaConsumer, AIOKafkaAdminClient and
    AIOKafkaClient alike."""
    kwargs: dict[str, Any] = {"security_protocol": settings.security_protocol, "ssl_context": ssl_context(settings)}
    if (login := settings.sasl_login) is not None:
        kwargs |= {"sasl_mechanism": settings.sasl_mechanism, "sasl_plain_username": login[0],
                   "sasl_plain_password": login[1]}
    return kwargs
