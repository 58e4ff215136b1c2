"""The page's routes: HTML views and their JSON twins, over `RunReads`. No front-end build: Jinja templates,
server-drawn SVG, one small script."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field, field_validator

from analytics.view.charts import Series, chart
from analytics.view.reads import Curves, Filters, Group, RolloutRow, RunReads, RunSummary, Trajectory

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")


def logprob_colour(logprob: float) -> str:
    """Red for an unlikely token, green for a certain one (by its probability)."""
    p = math.exp(max(logprob, -30.0))
    return f"hsl({120 * p:.0f}, 75%, {88 - 10 * p:.0f}%)"


VALIDATION_COLOURS = ("#37c", "#c73", "#a4c", "#777", "#c3a", "#3aa")


def reward_series(c: Curves) -> list[Series]:
    """Training reward by the weight version that sampled it (± its spread), and beside it, on the same versions,
    each held-out validation setting's mean reward (dashed): none for a run without validation."""
    training = Series("training", [(v, m) for v, m, _ in c.reward_by_version], [s for _, _, s in c.reward_by_version])
    return [training, *(Series(f"validation: {setting}", points, dashed=True,
                               colour=VALIDATION_COLOURS[i % len(VALIDATION_COLOURS)])
                        for i, (setting, points) in enumerate(c.validation_by_version.items()))]


def run_charts(c: Curves) -> list[str]:
    """The run page's charts, in the order shown."""
    return [
        chart("mean reward by update", [Series("reward", c.reward_by_update)], "update (weight version)", "reward"),
        chart("reward by sampling weight version (± spread)", reward_series(c), "weight version", "reward"),
        chart("loss by update", [Series("loss", c.loss_by_update, colour="#c73")], "update", "loss"),
        chart("trainable tokens by update", [Series("tokens", c.tokens_by_update, colour="#37c")], "update",
              "tokens"),
        chart("rollouts by weight version", [Series("rollouts", c.rollouts_by_version, colour="#777", bars=True)],
              "weight version", "rollouts"),
        chart("calls per rollout", [Series("rollouts", c.calls_per_rollout, colour="#37c", bars=True)], "calls",
              "rollouts"),
    ]


templates.env.filters["logprob_colour"] = logprob_colour
templates.env.filters["exp"] = lambda v: math.exp(max(v, -30.0))


class FilterQuery(BaseModel):
    """The rollouts view's filters, as query parameters; an empty field (a blank form input) is no filter."""
    task: str | None = None
    status: str | None = None
    version: int | None = Field(None, ge=0)
    reward_min: float | None = None
    reward_max: float | None = None
    validation: bool | None = None  # the kind: held-out validation rollouts (true) or training ones (false)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_none(cls, value: Any) -> Any:
        return None if value == "" else value

    def filters(self) -> Filters:
        return Filters(**self.model_dump())


def router(reads: RunReads) -> APIRouter:
    r = APIRouter()

    def page(request: Request, name: str, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, context)

    @r.get("/", response_class=HTMLResponse)
    def runs_page(request: Request) -> HTMLResponse:
        return page(request, "runs.html", runs=reads.runs())

    @r.get("/runs/{run}", response_class=HTMLResponse)
    def run_page(request: Request, run: str) -> HTMLResponse:
        c = reads.curves(run)
        return page(request, "run.html", run=run, charts=run_charts(c), latency=c.latency, validation=c.validation,
                    summary=next((s for s in reads.runs() if s.run_id == run), None))

    @r.get("/runs/{run}/rollouts", response_class=HTMLResponse)
    def rollouts_page(request: Request, run: str, filters: Annotated[FilterQuery, Query()]) -> HTMLResponse:
        chosen = filters.filters()
        return page(request, "rollouts.html", run=run, rows=reads.rollouts(run, chosen), filters=chosen)

    def found_group(run: str, group_id: str) -> Group:
        group = reads.group(run, group_id)
        if group is None:
            raise HTTPException(404, f"run {run} has no task group {group_id}")
        return group

    def found_trajectory(run: str, rollout_id: str) -> Trajectory:
        trajectory = reads.trajectory(run, rollout_id)
        if trajectory is None:
            raise HTTPException(404, f"run {run} has no rollout {rollout_id}")
        return trajectory

    @r.get("/runs/{run}/groups/{group_id:path}", response_class=HTMLResponse)
    def group_page(request: Request, run: str, group_id: str) -> HTMLResponse:
        return page(request, "group.html", run=run, group=found_group(run, group_id))

    @r.get("/runs/{run}/rollouts/{rollout_id:path}", response_class=HTMLResponse)
    def trajectory_page(request: Request, run: str, rollout_id: str) -> HTMLResponse:
        return page(request, "trajectory.html", run=run, t=found_trajectory(run, rollout_id))

    @r.get("/diverge", response_class=HTMLResponse)
    def diverge_page(request: Request, a: str | None = None, b: str | None = None,
                     show: Annotated[int, Query(ge=0, le=500)] = 20) -> HTMLResponse:
        comparison = reads.diverge(a, b) if a and b else None
        return page(request, "diverge.html", runs=reads.runs(), c=comparison, show=show)

    @r.get("/api/diverge")
    def diverge_json(a: str, b: str) -> dict[str, Any]:
        return reads.diverge(a, b).to_json()

    @r.get("/api/runs")
    def runs_json() -> list[RunSummary]:
        return reads.runs()

    @r.get("/api/runs/{run}/rollouts")
    def rollouts_json(run: str, filters: Annotated[FilterQuery, Query()]) -> list[RolloutRow]:
        return reads.rollouts(run, filters.filters())

    @r.get("/api/runs/{run}/curves")
    def curves_json(run: str) -> Curves:
        return reads.curves(run)

    @r.get("/api/runs/{run}/groups/{group_id:path}")
    def group_json(run: str, group_id: str) -> Group:
        return found_group(run, group_id)

    @r.get("/api/runs/{run}/rollouts/{rollout_id:path}")
    def trajectory_json(run: str, rollout_id: str) -> Trajectory:
        return found_trajectory(run, rollout_id)

    return r
