"""Run one gateway process: `tether gateway serve`."""

from __future__ import annotations

import json
import logging
import os

from gateway.app import create_app
from gateway.settings import GatewaySettings
from infra.serving import serve_app


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"t": self.formatTime(record), "level": record.levelname, "logger": record.name,
                 "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def serve(settings: GatewaySettings) -> None:
    settings.check_exposure()  # DevelopmentKeysExposed before anything starts
    # Encoding one prompt on a thread pool costs more than it saves, and the cores are the engine's.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    serve_app(create_app(settings), host=settings.host, port=settings.port, log_level="warning",
              limit_concurrency=4096, timeout_keep_alive=30)
