"""Run the view's process: `tether view`."""

from __future__ import annotations

from collections.abc import Callable

import uvicorn

from analytics.view.app import create_app
from analytics.view.settings import ViewSettings
from schemas.settings import BusSettings


def serve(settings: ViewSettings, bus: BusSettings, say: Callable[[str], None]) -> None:
    """Open the store, say where the page is, serve it until interrupted. AnalyticsError: the store cannot be
    opened (nothing is served)."""
    app = create_app(settings, bus)
    say(f"tether view: http://{settings.host}:{settings.port}/")
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
