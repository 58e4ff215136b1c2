"""Health and Prometheus metrics: unauthenticated, for load balancers and scrapers."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import generate_latest

from gateway.http.deps import Service, Settings

router = APIRouter()


@router.get("/health")
async def health(settings: Settings) -> dict[str, Any]:
    return {"status": "ok", "gateway_id": settings.gateway_id}


@router.get("/metrics")
async def metrics(gateway: Service) -> Response:
    gauges, gate = gateway.metrics, gateway.gate
    gauges.held.set(gate.held)  # sampled when scraped
    gauges.in_flight.set(gate.in_flight)
    return Response(generate_latest(gauges.registry), media_type="text/plain; version=0.0.4")
