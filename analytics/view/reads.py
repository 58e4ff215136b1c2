"""What the pages show, read from the store: typed records, no HTML. `RunReads` is the service the router serves."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from analytics.sink import QUERIES
from analytics.view.store import ViewStore
from repro.diverge import Call as DivergeCall
from repro.diverge import Comparison, call_of, compare, keyed
from schemas.calls import join_request


class Decoder(Protocol):
    def __call__(self, token_ids: list[int]) -> list[str]: ...


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    run_id: str
    rollouts: int  # training rollouts: held-out validation ones are counted apart
    finished: int
    mean_reward: float | None  # over the training rollouts rewarded
    updates: int
    last_seen: datetime | None
    validation_rollouts: int = 0


@dataclass(frozen=True, kw_only=True)
class Curves:
    """Series of (x, y) or (x, mean, std) for the run's charts, and tables for what is not a curve."""
    reward_by_update: list[tuple[float, float]]
    loss_by_update: list[tuple[float, float]]
    tokens_by_update: list[tuple[float, float]]
    reward_by_version: list[tuple[float, float, float]]  # version, mean, std over the rollouts it sampled
    rollouts_by_version: list[tuple[float, float]]
    calls_per_rollout: list[tuple[float, float]]  # calls → rollouts
    latency: list[dict[str, Any]]  # per API: p50/p90/p99 ms
    #: held-out validation: per sampling setting, (weight version, mean reward); empty for a run without it
    validation_by_version: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    validation: list[dict[str, Any]] = field(default_factory=list)  # validation_per_version's rows


@dataclass(frozen=True, kw_only=True)
class RolloutRow:
    rollout_id: str
    group_id: str
    task_id: str
    attempt: int
    status: str  # "running" until its RolloutFinished
    reward: float | None
    version: int | None  # the weight version of its first call
    calls: int
    duration_s: float | None
    reason: str | None
    validation: bool = False  # a held-out validation rollout: scored, never trained on
    temperature: float | None = None  # the sampling temperature its token pinned; None: the harness's own


@dataclass(frozen=True, kw_only=True)
class Filters:
    task: str | None = None
    status: str | None = None
    version: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    validation: bool | None = None  # True: held-out validation rollouts only; False: training ones only


@dataclass(frozen=True, kw_only=True)
class GroupMember:
    row: RolloutRow
    advantage: float | None  # None: no reward, or (the group trained) not among the rollouts trained on
    calls: dict[int, float]  # with credit per call: each call's advantage, by its seq
    answer: str  # the last call's response text


@dataclass(frozen=True, kw_only=True)
class Group:
    run_id: str
    group_id: str
    task_id: str
    members: list[GroupMember]
    trained: bool  # a task group on tether.samples holds it
    trained_in: int | None  # the update whose TrainerStep gave the advantages; None: estimated here
    validation: bool = False  # held-out validation rollouts: never trained on, so no advantages


@dataclass(frozen=True, kw_only=True)
class Token:
    text: str
    logprob: float


@dataclass(frozen=True, kw_only=True)
class Call:
    seq: int
    call_id: str
    api: str
    status: str
    error: str | None
    weight_version: int
    messages: list[dict[str, Any]]  # as the harness sent them
    tools: list[str]  # names of the tools offered
    answer: str
    tool_calls: list[dict[str, Any]]
    tokens: list[Token]
    prompt_tokens: int
    engine_ms: float
    queued_ms: float
    latency_ms: float
    received_at: datetime


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    row: RolloutRow
    calls: list[Call] = field(default_factory=list)


def advantages(rewards: list[float | None]) -> list[float | None]:
    """Until an update has trained the group: the trainer's default estimator (verl's GRPO, outcome credit), (r -
    mean) / (sample std + 1e-6) over the group's rewarded rollouts, 0 where there is no signal."""
    known = [r for r in rewards if r is not None]
    if len(known) < 2 or max(known) - min(known) <= 1e-12:
        return [None if r is None else 0.0 for r in rewards]
    mean, std = statistics.fmean(known), statistics.stdev(known)
    return [None if r is None else (r - mean) / (std + 1e-6) for r in rewards]


def conversation(api: str, request: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The messages and tool names of a request in any of the gateway's APIs."""
    messages: list[dict[str, Any]] = []
    if api == "anthropic.messages" and request.get("system"):
        messages.append({"role": "system", "content": request["system"]})
    if api == "openai.responses":
        if request.get("instructions"):
            messages.append({"role": "system", "content": request["instructions"]})
        items = request.get("input")
        messages += [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
    elif api == "openai.completions":
        messages.append({"role": "prompt", "content": request.get("prompt", "")})
    else:
        messages += list(request.get("messages") or [])
    tools = [t.get("name") or (t.get("function") or {}).get("name") or "?" for t in request.get("tools") or []]
    return messages, tools


def answer_of(api: str, response: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The response's text and tool calls (name and arguments), whatever the API."""
    if api == "anthropic.messages":
        blocks = response.get("content") or []
        return ("".join(b.get("text", "") for b in blocks if b.get("type") == "text"),
                [{"name": b.get("name"), "arguments": b.get("input")} for b in blocks if b.get("type") == "tool_use"])
    if api == "openai.responses":
        items = response.get("output") or []
        text = "".join(c.get("text", "") for i in items if i.get("type") == "message" for c in i.get("content") or [])
        return text, [{"name": i.get("name"), "arguments": i.get("arguments")} for i in items
                      if i.get("type") == "function_call"]
    choice = (response.get("choices") or [{}])[0]
    if api == "openai.completions":
        return choice.get("text") or "", []
    message = choice.get("message") or {}
    calls = [{"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
             for c in message.get("tool_calls") or []]
    return message.get("content") or "", calls


def _loads(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def validation_curves(rows: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """validation_per_version's rows as a curve per sampling setting, (version, mean reward) by version."""
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        curves.setdefault(r["setting"], []).append((float(r["version"]), float(r["mean_reward"])))
    return {setting: sorted(points) for setting, points in curves.items()}


def _sql(name: str) -> str:
    return (QUERIES / f"{name}.sql").read_text()


ROLLOUTS = """
SELECT r.rollout_id AS rollout_id, r.group_id AS group_id, r.task_id AS task_id, r.attempt AS attempt,
       if(f.rollout_id = '', 'running', f.status) AS status, f.reward AS reward,
       if(f.rollout_id = '', NULL, f.duration_s) AS duration_s, f.reason AS reason,
       c.version AS version, c.calls AS calls, r.started_at AS started_at, r.validation AS validation,
       r.temperature AS temperature
FROM (SELECT * FROM rollouts FINAL WHERE run_id = {run:String}) AS r
LEFT JOIN (SELECT * FROM rollout_results FINAL WHERE run_id = {run:String}) AS f USING (rollout_id)
LEFT JOIN (SELECT rollout_id, min(weight_version) AS version, count() AS calls FROM calls FINAL
           WHERE run_id = {run:String} GROUP BY rollout_id) AS c USING (rollout_id)
"""


class RunReads:
    def __init__(self, store: ViewStore, decode: Decoder | None = None) -> None:
        self.store, self.decode = store, decode

    def runs(self) -> list[RunSummary]:
        rows = self.store.rows("""
            SELECT r.run_id AS run_id, countIf(NOT r.validation) AS rollouts,
                   countIf(f.rollout_id != '' AND NOT r.validation) AS finished,
                   avgIf(f.reward, f.reward IS NOT NULL AND NOT r.validation) AS mean_reward,
                   countIf(r.validation) AS validation_rollouts, max(r.started_at) AS last_seen
            FROM (SELECT * FROM rollouts FINAL) AS r
            LEFT JOIN (SELECT * FROM rollout_results FINAL) AS f USING (rollout_id)
            GROUP BY run_id ORDER BY last_seen DESC""")
        updates = {r["run_id"]: r["n"] for r in self.store.rows(
            "SELECT run_id, count() AS n FROM updates FINAL GROUP BY run_id")}
        return [RunSummary(run_id=r["run_id"], rollouts=r["rollouts"], finished=r["finished"],
                           mean_reward=_finite(r["mean_reward"]), updates=updates.get(r["run_id"], 0),
                           last_seen=r["last_seen"], validation_rollouts=r["validation_rollouts"]) for r in rows]

    def curves(self, run: str) -> Curves:
        updates = self.store.rows("SELECT version, mean_reward, loss, tokens FROM updates FINAL "
                                  "WHERE run_id = {run:String} ORDER BY version", run=run)
        versions = self.store.rows(_sql("reward_per_version"), run=run)
        validation = self.store.rows(_sql("validation_per_version"), run=run)
        return Curves(
            reward_by_update=[(u["version"], u["mean_reward"]) for u in updates],
            loss_by_update=[(u["version"], u["loss"]) for u in updates],
            tokens_by_update=[(u["version"], float(u["tokens"])) for u in updates],
            reward_by_version=[(v["weight_version"], v["mean_reward"], v["reward_std"]) for v in versions],
            rollouts_by_version=[(v["weight_version"], float(v["rollouts"])) for v in versions],
            calls_per_rollout=[(c["calls"], float(c["rollouts"])) for c in self.store.rows(
                _sql("calls_per_rollout"), run=run)],
            latency=self.store.rows(_sql("gateway_latency"), run=run),
            validation_by_version=validation_curves(validation), validation=validation)

    def rollouts(self, run: str, filters: Filters = Filters()) -> list[RolloutRow]:
        where, parameters = ["1"], {"run": run}
        if filters.task:
            where.append("task_id = {task:String}")
            parameters["task"] = filters.task
        if filters.status:
            where.append("status = {status:String}")
            parameters["status"] = filters.status
        if filters.version is not None:
            where.append("calls > 0 AND version = {version:Int64}")  # no calls: no version (the join's 0)
            parameters["version"] = str(filters.version)
        if filters.reward_min is not None:
            where.append("reward >= {reward_min:Float64}")
            parameters["reward_min"] = str(filters.reward_min)
        if filters.reward_max is not None:
            where.append("reward <= {reward_max:Float64}")
            parameters["reward_max"] = str(filters.reward_max)
        if filters.validation is not None:
            where.append("validation" if filters.validation else "NOT validation")
        rows = self.store.rows(f"SELECT * FROM ({ROLLOUTS}) WHERE {' AND '.join(where)} "
                               "ORDER BY started_at, rollout_id",
                               **parameters)
        return [_rollout(r) for r in rows]

    def group(self, run: str, group_id: str) -> Group | None:
        rows = [_rollout(r) for r in self.store.rows(
            f"SELECT * FROM ({ROLLOUTS}) WHERE group_id = {{group:String}} ORDER BY rollout_id", run=run,
            group=group_id)]
        if not rows:
            return None
        trained = bool(self.store.rows("SELECT 1 FROM task_groups FINAL WHERE run_id = {run:String} AND "
                                       "group_id = {group:String}", run=run, group=group_id))
        last = {r["rollout_id"]: r for r in self.store.rows(
            "SELECT rollout_id, argMax(response_json, seq) AS response, any(api) AS api FROM call_contents FINAL "
            "INNER JOIN (SELECT call_id, api FROM calls FINAL WHERE run_id = {run:String}) AS a USING (call_id) "
            "WHERE run_id = {run:String} AND rollout_id IN {ids:Array(String)} GROUP BY rollout_id",
            run=run, ids=[r.rollout_id for r in rows])}
        given = {r["rollout_id"]: r for r in self.store.rows(
            "SELECT * FROM given_advantages FINAL WHERE run_id = {run:String} AND group_id = {group:String}",
            run=run, group=group_id)}
        validation = any(r.validation for r in rows)
        estimated: list[float | None] = [None] * len(rows) if validation else advantages([r.reward for r in rows])
        members = []
        for row, estimate in zip(rows, estimated, strict=True):
            found = last.get(row.rollout_id)
            text, tool_calls = answer_of(found["api"], _loads(found["response"])) if found else ("", [])
            text = "\n".join([text, *(f"{c['name']}({_arguments(c['arguments'])})" for c in tool_calls)]).strip()
            mine = given.get(row.rollout_id)
            members.append(GroupMember(
                row=row, advantage=(mine["advantage"] if mine else None) if given else estimate, answer=text,
                calls=dict(zip(mine["call_seqs"], mine["call_advantages"], strict=True)) if mine else {}))
        trained_in = max((int(r["version"]) for r in given.values()), default=None)
        return Group(run_id=run, group_id=group_id, task_id=rows[0].task_id, members=members, trained=trained,
                     trained_in=trained_in, validation=validation)

    def trajectory(self, run: str, rollout_id: str) -> Trajectory | None:
        found = self.store.rows(f"SELECT * FROM ({ROLLOUTS}) WHERE rollout_id = {{rid:String}}", run=run,
                                rid=rollout_id)
        if not found:
            return None
        rows = self.store.rows(
            "SELECT * FROM call_contents FINAL INNER JOIN (SELECT call_id, api, latency_ms, prompt_tokens "
            "FROM calls FINAL WHERE run_id = {run:String}) AS a USING (call_id) WHERE run_id = {run:String} AND "
            "rollout_id = {rid:String} ORDER BY seq, choice_index", run=run, rid=rollout_id)
        calls = []
        for r, request in zip(rows, _whole_requests(rows), strict=True):
            messages, tools = conversation(r["api"], _loads(request))
            text, tool_calls = answer_of(r["api"], _loads(r["response_json"]))
            ids = list(r["response_token_ids"])
            pieces = self.decode(ids) if self.decode is not None else [f"#{i}" for i in ids]
            calls.append(Call(
                seq=r["seq"], call_id=r["call_id"], api=r["api"], status=r["status"], error=r["error"],
                weight_version=r["weight_version"], messages=messages, tools=tools, answer=text,
                tool_calls=tool_calls, tokens=[Token(text=p, logprob=lp) for p, lp in
                                               zip(pieces, r["response_logprobs"], strict=True)],
                prompt_tokens=r["prompt_tokens"], engine_ms=r["engine_ms"], queued_ms=r["queued_ms"],
                latency_ms=r["latency_ms"], received_at=r["received_at"]))
        return Trajectory(row=_rollout(found[0]), calls=calls)

    def diverge(self, run_a: str, run_b: str) -> Comparison:
        """`tether diverge`'s comparison of two runs in the store (the training data hashes and the calls the same in
        tokens aside: the store keeps no task group's tokens and no prompt ids)."""
        paired = {}
        for run in (run_a, run_b):
            started = [_Started(r["rollout_id"], r["group_id"], r["task_id"], r["attempt"], r["seed"])
                       for r in self.store.rows("SELECT rollout_id, group_id, task_id, attempt, seed FROM rollouts "
                                                "FINAL WHERE run_id = {run:String}", run=run)]
            rows = self.store.rows(
                "SELECT call_id, rollout_id, seq, choice_index, request_json, response_json, response_token_ids, "
                "response_logprobs, extends, request_head, request_tail FROM call_contents FINAL "
                "WHERE run_id = {run:String} ORDER BY rollout_id, seq, choice_index", run=run)
            calls: dict[str, list[DivergeCall]] = {}
            for r, request in zip(rows, _whole_requests(rows), strict=True):
                if r["choice_index"] == 0:
                    calls.setdefault(r["rollout_id"], []).append(call_of(
                        r["seq"], request, r["response_json"], r["response_token_ids"], r["response_logprobs"]))
            paired[run] = keyed(started, calls, run)
        return compare(run_a, paired[run_a], run_b, paired[run_b])


def _whole_requests(rows: list[dict[str, Any]]) -> list[str]:
    """Each call's request whole: one recorded as its difference from the call it extends (an earlier row) is
    joined to it."""
    requests: dict[str, str] = {}
    out = []
    for r in rows:
        request = r["request_json"]
        if r["extends"] is not None and r["extends"] in requests:
            request = join_request(requests[r["extends"]], r["request_head"], r["request_tail"], request)
        requests[r["call_id"]] = request
        out.append(request)
    return out


@dataclass(frozen=True)
class _Started:
    rollout_id: str
    group_id: str
    task_id: str
    attempt: int
    seed: int | None


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _finite(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def _rollout(r: dict[str, Any]) -> RolloutRow:
    return RolloutRow(rollout_id=r["rollout_id"], group_id=r["group_id"], task_id=r["task_id"],
                      attempt=r["attempt"], status=r["status"], reward=_finite(r["reward"]),
                      version=r["version"] if r["calls"] else None, calls=r["calls"] or 0,
                      duration_s=r["duration_s"], reason=r["reason"], validation=bool(r["validation"]),
                      temperature=_finite(r["temperature"]))
