"""infra/grafana/tether.json against what the gateway really serves on /metrics: every series a panel queries
exists, every metric has a panel, and the panels tile the page."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gateway.metrics import Metrics

DASHBOARD = Path(__file__).parent.parent / "infra" / "grafana" / "tether.json"


def served() -> dict[str, str]:
    """Series name → metric, as Prometheus scrapes them (counters get _total, histograms _bucket/_sum/_count)."""
    names: dict[str, str] = {}
    for family in Metrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names.update({family.name + s: family.name for s in suffixes})
    return names


def test_every_gateway_series_queried_is_served_and_every_metric_has_a_panel() -> None:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    queried = {m for e in exprs for m in re.findall(r"\btether_gateway_\w+", e)}
    series = served()
    assert queried <= series.keys(), queried - series.keys()
    assert {series[q] for q in queried} == set(series.values())  # nothing the gateway measures goes unseen
    assert all(re.search(r"vllm:\w+", e) for e in exprs if "tether_gateway" not in e)


def test_panels_have_their_own_ids_and_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] + pos["w"] <= 24
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, p["title"]
        cells |= mine
