"""Run one gateway process: `tether gateway serve`."""

from __future__ import annotations

import logging
import os

import uvicorn

from gateway.app import create_app
from gateway.settings import GatewaySettings


def serve(settings: GatewaySettings) -> None:
    # Encoding one prompt on a thread pool costs more than it saves, and the cores are the engine's.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(level=logging.INFO, format='{"t": "%(asctime)s", "level": "%(levelname)s", '
                        '"logger": "%(name)s", "msg": "%(message)s"}')
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
                limit_concurrency=4096, timeout_keep_alive=30)
