"""An ASGI app served by uvicorn on the socket a supervisor handed over (`infra.supervisor`), or else on its own.

The gateway and the engine serve through this, so that under the supervisor a
restart keeps their port listening; run alone they bind as before.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

from infra.supervisor import inherited_socket, notify_ready


class _Server(uvicorn.Server):
    """uvicorn's server, telling the supervisor when its app has started and it accepts connections."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            notify_ready()


def serve_app(app: Any, *, host: str, port: int, **options: Any) -> None:
    """Until the server is told to stop (SIGTERM, SIGINT); `options` are uvicorn's."""
    sock = inherited_socket()
    server = _Server(uvicorn.Config(app, host=host, port=port, **options))
    server.run(sockets=[sock] if sock is not None else None)
