"""Kafka's refusals as one line each: which client, as which principal, was refused what, and why.

An ACL denial arrives as an authorization error that names the topic or group. A failed login or an
untrusted certificate does not: aiokafka only logs it and raises "Unable to bootstrap", so `refusal`
connects once more, directly and within the request timeout, to learn the cause. Either way the caller
gets an AccessDenied it can print, instead of a retry loop or a bare connection error.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable

from aiokafka.conn import create_conn
from aiokafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    KafkaConnectionError,
    SaslAuthenticationFailed,
    TopicAuthorizationFailedError,
)

from schemas.errors import AccessDenied, AuthenticationFailed, NotAuthorized, UntrustedBroker
from schemas.security import client_kwargs
from schemas.settings import BusSettings


def not_authorized(settings: BusSettings, client_id: str, operation: str, resource: str) -> NotAuthorized:
    """`operation` as a verb phrase ("write to", "read", "create"), `resource` as "topic NAME" or "group NAME"."""
    return NotAuthorized(f"{client_id} as {settings.principal} may not {operation} {resource}: Kafka's ACLs do "
                         "not allow it")


def authorization_error(exc: BaseException, settings: BusSettings, client_id: str,
                        operation: str) -> NotAuthorized | None:
    """The project's error for an ACL denial aiokafka raised, None for any other error."""
    if isinstance(exc, TopicAuthorizationFailedError):
        return not_authorized(settings, client_id, operation, f"topic {_names(exc)}")
    if isinstance(exc, GroupAuthorizationFailedError):
        return not_authorized(settings, client_id, "use", f"consumer group {_names(exc)}")
    if isinstance(exc, ClusterAuthorizationFailedError):
        return not_authorized(settings, client_id, operation, "the cluster")
    return None


async def refusal(exc: BaseException, settings: BusSettings, client_id: str, operation: str) -> AccessDenied | None:
    """The project's error if Kafka refused this client (ACL, login, certificate), None otherwise."""
    denied = authorization_error(exc, settings, client_id, operation)
    if denied is not None or not isinstance(exc, KafkaConnectionError) or settings.security_protocol == "PLAINTEXT":
        return denied
    host, port = _first_server(settings)
    try:
        async with asyncio.timeout(settings.request_timeout_ms / 1000):
            conn = await create_conn(host, port, client_id=client_id, request_timeout_ms=settings.request_timeout_ms,
                                     **client_kwargs(settings))
        conn.close()
        return None  # it connects now: a passing outage, not a refusal
    except (SaslAuthenticationFailed, ssl.SSLError) as cause:
        return _connection_refused(cause, settings, client_id, f"{host}:{port}")
    except Exception:
        return None


def _connection_refused(cause: BaseException, settings: BusSettings, client_id: str, server: str) -> AccessDenied:
    who = f"{client_id} as {settings.principal}"
    if isinstance(cause, SaslAuthenticationFailed):
        return AuthenticationFailed(f"{who} could not log in to Kafka at {server} with {settings.sasl_mechanism}: "
                                    "wrong username or password")
    if isinstance(cause, ssl.SSLCertVerificationError):
        trusted = settings.ca_file or "the system's CAs (TETHER_BUS_CA_FILE is unset)"
        return UntrustedBroker(f"{who} does not trust Kafka at {server}: {cause.verify_message}; trusted: {trusted}")
    reason = cause.reason if isinstance(cause, ssl.SSLError) and cause.reason else str(cause)
    return AccessDenied(f"{who}: the TLS handshake with Kafka at {server} failed ({reason})")


def _names(exc: BaseException) -> str:
    found = exc.args[0] if exc.args else "?"
    return ", ".join(sorted(found)) if isinstance(found, Iterable) and not isinstance(found, str) else str(found)


def _first_server(settings: BusSettings) -> tuple[str, int]:
    host, _, port = settings.bootstrap_servers.split(",")[0].strip().rpartition(":")
    return host.strip("[]"), int(port)
