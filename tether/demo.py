"""`make run`: the demo training job on the embedded defaults, from a fresh machine to plots and a summary.

    tiny model → warm-start (format) → `tether up` → controller runs the openai-SDK agent on the task
    (K per task, async) while the trainer updates, and validates on held-out tasks every few versions →
    summary, plots, replay check → `tether down`

Two tasks (`TETHER_DEMO_TASK`, `tether demo --task`), each with its preset of
settings (any of which the environment overrides):

    letters  one call: of six letters, submit A (`make run`)
    lookup   one to three lookups, then submit the number found (examples/lookup_task.py): calls per rollout vary
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from rich.console import Console
from rich.table import Table

from schemas.events import Event, ModelCall, TaskGroup, ValidationReported
from tether.modules import load_file
from tether.progress import Shown, status

if TYPE_CHECKING:
    from tether.stack import Stack, StackSettings

ROOT = Path(__file__).parent.parent
AGENT = ROOT / "examples" / "openai_agent.py"
LOOKUP = ROOT / "examples" / "lookup_task.py"
NO_SIGNAL_UPDATES = 3  # all rewards 0 for this many updates: stop rather than spend the rest of the budget
FILL_CAP = 3  # with fill signal, an update takes at most this many batches' worth of groups
VALIDATION_WAIT_S = 600  # for the controller's round of the last version, after the last update
Task = Literal["letters", "lookup"]
#: Each task's settings where the environment names none.
PRESETS: dict[Task, dict[str, Any]] = {
    # greedy is no measure here: the warm model's single likeliest letter is already A (the question names it),
    # while its sampled answers are right about one time in six; so the harness's own sampling is validated
    "letters": {"updates": 24, "copy_steps": 0, "warm_steps": 200, "lr": 5e-4, "max_turns": 3, "validate_every": 6,
                "validation_tasks": 32, "validation_temperatures": [None]},
    # the answer is copied from tool results: the tiny model is first taught to copy (tether/copying.py)
    # half the training tasks three lookups deep, and K=16: with uniform depths and K=8 the policy learned "submit
    # after the second lookup" from the shallow tasks long before a deep group had a success to learn from (held-out
    # 0.70 after 45 updates, depth 3 at 0.00); bench/ablation.py --train-depths measures it
    # fill signal: each update learns from 8 groups whose rewards differ (with fill groups, 0 to 5 of each 8, median
    # 2; where verl got by v30 varied from 0.11 to 1.00). Tried alone, the policy collapsed at v2: the `\n` after
    # `<tool_call>` opens every call, failing rollouts make more calls, and Adam took its tiny negative gradient to a
    # full step (0.9999 → 0.0021; bench/replay_updates.py replays it, on both backends alike); adam_eps 1e-5 leaves
    # such near-zero gradients nearly still
    "lookup": {"updates": 30, "copy_steps": 1800, "warm_steps": 500, "lr": 2e-4, "max_turns": 6, "group_size": 16,
               "training_depths": [1, 2, 3, 3], "validate_every": 5, "validation_tasks": 64,
               "validation_temperatures": [0.0], "fill": "signal", "adam_eps": 1e-5},
}


class DemoSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TETHER_DEMO_", frozen=True)

    task: Task = Field("letters", description="The demo task; its preset fills the settings not given.")
    run_id: str = Field(default_factory=lambda: f"demo-{time.strftime('%Y%m%d-%H%M%S')}")
    home: Path = Path(".tether")
    group_size: int = Field(8, ge=2)
    batch_groups: int = Field(8, ge=1)
    fill: Literal["groups", "signal"] = Field(
        "groups", description="groups: each update takes the next B groups; signal: groups until B have rewards "
                              "that differ (at most 3 B).")
    updates: int = Field(ge=1)
    concurrency: int = Field(8, ge=1)
    copy_steps: int = Field(ge=0, description="Steps teaching the tiny model to copy before the warm-start (0: none).")
    warm_steps: int = Field(ge=0)
    lr: float = Field(gt=0)
    kl_coef: float = 0.01
    adam_eps: float = Field(1e-8, gt=0)
    epochs: int = Field(2, ge=1)
    mini_batches: int = Field(1, ge=1)
    max_turns: int = Field(ge=1, description="The agent's model calls per rollout at most.")
    backend: Literal["torch", "verl"] = Field("torch", description="verl: the update on verl's own workers (Ray).")
    workers: int = Field(2, ge=1, description="With backend verl: its data-parallel workers.")
    lora_rank: int = Field(0, ge=0, description="0: train every weight; R: rank-R adapters on every linear layer "
                           "(alpha 2R), each version handed to the engine as an adapter.")
    lora_targets: list[str] | None = Field(None, description="With lora_rank: the modules that get adapters (JSON "
                                           "list, e.g. with lm_head); default every linear layer but the head.")
    validation_tasks: int = Field(ge=0, description="Held-out tasks validated (0: no validation).")
    validate_every: int = Field(ge=1, description="Validate every N weight versions, and the first and last.")
    validation_temperatures: list[float | None] = Field(
        min_length=1, description="Validation settings (JSON list): 0 greedy, null the harness's own sampling.")
    training_depths: list[Annotated[int, Field(ge=1, le=3)]] = Field(
        [1, 2, 3], min_length=1, description="Lookup: the training tasks' depths, drawn uniformly from this list "
                                              "(JSON); held-out tasks are always uniform over 1-3.")
    seed: int = 0
    images: bool = Field(False, description="Every service, and the broker, in a container of its own from the "
                         "images (`make images`, tether.image_stack), meeting over the network.")
    images_tag: str | None = Field(None, description="With images: their tag (default: the project's version, "
                                   "as `make images` tags them).")

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        preset = PRESETS.get(data.get("task", "letters"), {})
        return {**preset, **data}


def _agent_module() -> Any:
    return load_file(AGENT)


@dataclass(frozen=True)
class DemoTask:
    """What the demo needs of a task: tasks by index (held-out and training), and the format-only episodes its
    warm-start learns from."""
    make: Any  # (random.Random, index) -> task
    train: Any  # the same, for the training tasks
    turns: Any  # (random.Random) -> list of warm-start turns
    summary: str
    chance: str  # what the format alone scores


def _task_module(settings: DemoSettings) -> DemoTask:
    from tether.warm_start import OPTIONS, letter_turns, task

    if settings.task == "letters":
        return DemoTask(task, task, letter_turns,
                        f"openai-SDK agent: of {OPTIONS} letters, `submit` A (a tool call; malformed scores 0)",
                        f"chance is {1 / OPTIONS:.2f}")
    module = load_file(LOOKUP)
    return DemoTask(module.task, lambda rng, i: module.task(rng, i, rng.choice(settings.training_depths)),
                    lambda rng: module.random_turns(rng, module.task(rng, -1), settings.max_turns),
                    "openai-SDK agent: look up 1-3 words (facts drawn per task), `submit` the number found",
                    "an agent with the format alone scores about 0.16")


def main(settings: DemoSettings, console: Console) -> int:
    """Warm-start, train with the stack up, then the summary; the stack comes down whatever happens."""
    started = time.perf_counter()
    warm, warm_s = _warm_model(settings, console)
    run_dir = settings.home / "runs" / settings.run_id
    outcome = _run(settings, console, warm, run_dir)
    console.print(_summary(settings, run_dir, outcome, f"{time.perf_counter() - started:.0f} s (warm-start "
                                                        f"{warm_s:.0f} s)"))
    board = run_dir / "checkpoints" / settings.run_id / "tensorboard"
    for line in ("To see the run:",
                 f"  the page:    tether kafka up && tether view --run {settings.run_id} --model {warm}",
                 f"               then open http://127.0.0.1:8765/runs/{settings.run_id}",
                 f"  TensorBoard: tensorboard --logdir {board}",
                 "               then open http://localhost:6006"):
        console.print(line, highlight=False, soft_wrap=True)  # whole lines, to copy
    return 0


def _warm_model(settings: DemoSettings, console: Console) -> tuple[Path, float]:
    """The tiny model warm-started on the task's tool-call format; reused while its recipe is unchanged."""
    from tether.supervised import fit, recipe
    from tether.tiny_model import init_tiny
    from tether.warm_start import warm_start

    tiny = settings.home / "models" / "tiny"
    if not (tiny / "tokenizer.json").exists():
        with status(console, "building the tiny model..."):
            init_tiny(tiny)
    if settings.copy_steps:
        tiny = _copying_model(settings, console, tiny)  # its folder's name holds its own recipe
    agent = _agent_module()
    sources = [Path(warm_start.__code__.co_filename), Path(fit.__code__.co_filename)] + (
        [LOOKUP] if settings.task == "lookup" else [])
    warm = settings.home / "models" / (f"warm-{settings.task}-{settings.warm_steps}-seed{settings.seed}-"
                                       f"{recipe(*sources)}"  # the task too
                                       + (f"-from-{tiny.name}" if settings.copy_steps else ""))
    record = warm / "warm_start.json"  # written last: its presence means the folder is complete
    if record.exists():
        losses, warm_s = (json.loads(record.read_text())[k] for k in ("losses", "seconds"))
        console.print(f"warm-start: reusing {warm} ({settings.warm_steps} steps, trained in {warm_s:.0f} s by an "
                      f"earlier run; delete it to train again), loss {losses[0]:.3f} → {losses[-1]:.3f}")
        return warm, float(warm_s)
    with Shown(console, "warm-start: the tool-call format", settings.warm_steps) as bar:
        _, losses, warm_s = warm_start(
            tiny, warm, agent.SYSTEM, agent.TOOLS, steps=settings.warm_steps, seed=settings.seed,
            on_step=lambda i, loss: bar.update(i + 1, f"loss {loss:.3f}"), turns=_task_module(settings).turns)
    record.write_text(json.dumps({"losses": losses, "seconds": warm_s}))
    console.print(f"warm-start: {settings.warm_steps} steps in {warm_s:.0f} s, loss {losses[0]:.3f} → "
                  f"{losses[-1]:.3f}")
    return warm, warm_s


def _copying_model(settings: DemoSettings, console: Console, tiny: Path) -> Path:
    """The tiny model taught to copy from its context (tether/copying.py); reused once made."""
    from tether.copying import teach_copying
    from tether.supervised import fit, recipe

    sources = [Path(teach_copying.__code__.co_filename), Path(fit.__code__.co_filename)]
    base = settings.home / "models" / f"tiny-copying-{settings.copy_steps}-seed{settings.seed}-{recipe(*sources)}"
    if (base / "copying.json").exists():
        return base
    with Shown(console, "base skill: copying from the context", settings.copy_steps) as bar:
        _, losses, seconds = teach_copying(tiny, base, steps=settings.copy_steps, seed=settings.seed,
                                           on_step=lambda i, loss: bar.update(i + 1, f"loss {loss:.3f}"))
    (base / "copying.json").write_text(json.dumps({"losses": losses, "seconds": seconds}))
    console.print(f"copying: {settings.copy_steps} steps in {seconds:.0f} s, loss {losses[0]:.3f} → {losses[-1]:.3f}")
    return base


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the run left to summarise: the trainer's history, and the topics read back before the stack came
    down."""
    history: list[dict[str, float]]
    stored: list[TaskGroup]
    rebuilt: list[TaskGroup]
    events: list[Event]
    control: list[Event]  # tether.control: the held-out rounds' reports among them


def _run(settings: DemoSettings, console: Console, warm: Path, run_dir: Path) -> Outcome:
    """`tether up`, the controller running the agents while the trainer updates, the topics read back,
    `tether down`."""
    from schemas import topics
    from schemas.samples import unique_groups
    from stream_processors.grouping import Policy
    from stream_processors.replay import read_run_events, replay
    from tether.stack import StackSettings

    demo_task = _task_module(settings)
    make = demo_task.make
    rng = random.Random(settings.seed)
    n_tasks = settings.batch_groups * (settings.updates + 2) * (FILL_CAP if settings.fill == "signal" else 1)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "tasks.jsonl").write_text("".join(json.dumps(demo_task.train(rng, i)) + "\n" for i in range(n_tasks)))
    held_out = random.Random(f"held-out-{settings.seed}")  # tasks no update trains on: drawn apart
    (run_dir / "held_out.jsonl").write_text("".join(
        json.dumps({**make(held_out, i), "id": f"held-out-{i}"}) + "\n" for i in range(settings.validation_tasks)))
    stack_settings = StackSettings(run_id=settings.run_id, home=settings.home, model=warm, trainer={
        "batch_groups": settings.batch_groups, "max_updates": settings.updates, "lr": settings.lr,
        "kl_coef": settings.kl_coef if settings.backend == "torch" else 0.0,  # verl's has no reference workers
        "epochs": settings.epochs, "mini_batches": settings.mini_batches, "adam_eps": settings.adam_eps,
        "max_staleness": 2, "zero_variance": "drop", "fill": settings.fill,
        "max_fill_groups": settings.batch_groups * FILL_CAP, "backend": settings.backend, "workers": settings.workers,
        "validation_wait_s": 300,
        **({"lora": {"rank": settings.lora_rank, "alpha": 2 * settings.lora_rank,
                     **({"target_modules": settings.lora_targets} if settings.lora_targets else {})}}
           if settings.lora_rank else {})})
    stack = _stack(settings, stack_settings)
    try:
        what = "tether up: Kafka, engine, gateway, processors, trainer" + (
            " from the images, each in its own container" if settings.images else "")
        up_started = time.perf_counter()
        with status(console, f"{what}..."):
            stack.up()
        console.print(f"{what}: up in {time.perf_counter() - up_started:.0f} s")
        bus = stack.broker.client_settings()  # reading the run back as the cluster's admin
        agents = _start_controller(settings, stack, run_dir)
        try:
            history = _train(stack, settings, console, agents)
            if len(history) >= settings.updates and settings.validation_tasks:
                with status(console, "validating the last version on the held-out tasks..."):
                    _wait(agents, VALIDATION_WAIT_S)  # the controller ends by itself after the last round
        finally:
            agents.send_signal(signal.SIGINT)  # the controller cancels the rollouts still running, then exits
            try:
                agents.wait(60)
            except subprocess.TimeoutExpired:
                agents.kill()
        stored = asyncio.run(unique_groups(bus, settings.run_id))
        events, rebuilt = asyncio.run(replay(bus, settings.run_id, Policy()))
        control = asyncio.run(read_run_events(bus, settings.run_id, read=(topics.CONTROL,)))
    finally:
        with status(console, "tether down..."):
            stack.down()
    return Outcome(history=history, stored=stored, rebuilt=rebuilt, events=events, control=control)


def _wait(process: subprocess.Popen[bytes], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(seconds)


def _stack(settings: DemoSettings, stack_settings: StackSettings) -> Stack:
    """The process stack, or the same services from the images (the agent's folder mounted in each container)."""
    from infra.images.build import version
    from tether.image_stack import ImageStack, missing_images
    from tether.stack import Stack, StackError

    if not settings.images:
        return Stack(stack_settings)
    tag = settings.images_tag or version()
    missing = missing_images(tag)
    if missing:
        raise StackError(f"not built: {', '.join(missing)} (make images)")
    return ImageStack(stack_settings, tag, mounts=[AGENT.parent])


def _start_controller(settings: DemoSettings, stack: Stack, run_dir: Path) -> subprocess.Popen[bytes]:
    """`tether controller run` on the demo's run file, the openai-SDK agent preloaded, as its own process (or
    its own container). Unsandboxed, said in the run file: the agent's tools are lookups in its own process (the
    model's output runs nothing), and the zygote that saves each rollout the SDK's import forks outside any
    sandbox."""
    from tether.image_stack import ImageStack

    in_image = isinstance(stack, ImageStack)
    bus = stack.broker.client_env("controller")
    validation = {"validation": {"dataset": "held_out.jsonl", "every": settings.validate_every,
                                 "temperatures": settings.validation_temperatures}} if settings.validation_tasks else {}
    (run_dir / "controller.yaml").write_text(yaml.safe_dump({
        "run_id": settings.run_id, "dataset": "tasks.jsonl", "group_size": settings.group_size,
        "concurrency": settings.concurrency, "max_groups_in_flight": settings.batch_groups * 2,
        "timeout_s": 120, "log_dir": "rollouts",
        "harness": {"command": ["python" if in_image else sys.executable, str(AGENT.resolve()), "--max-turns",
                                str(settings.max_turns), "--max-tokens", "40"], "preload": ["openai"]},
        "sandbox": False, **validation}))
    s = stack.settings
    own = {**bus, "TETHER_CONTROLLER_GATEWAY_URL": s.gateway_url, "TETHER_CONTROLLER_GATEWAY_ADMIN_KEY": s.admin_key,
           "TETHER_CONTROLLER_GATEWAY_SECRET": s.secret}
    if isinstance(stack, ImageStack):
        return stack.run_controller(["tether", "controller", "run", str(run_dir / "controller.yaml")], own,
                                    run_dir / "controller.log")
    env = {**os.environ, **own}
    with (run_dir / "controller.log").open("ab") as log:
        return subprocess.Popen([sys.executable, "-m", "tether.cli", "controller", "run",
                                 str(run_dir / "controller.yaml")], env=env, stdout=log, stderr=subprocess.STDOUT)


def _summary(settings: DemoSettings, run_dir: Path, outcome: Outcome, took: str) -> Table:
    from stream_processors.pipeline import compare, content_hash
    from trainer import checkpoint
    from trainer.report import plot_history

    demo_task = _task_module(settings)
    history, stored = outcome.history, outcome.stored
    latest = checkpoint.latest(run_dir / "checkpoints" / settings.run_id)
    dsn = f"chdb://{(run_dir / 'clickhouse').resolve()}"
    validation = validation_by_version(outcome.control)
    plot = plot_history(history, run_dir / "updates.png", f"Tether demo {settings.run_id}",
                        validation) if history else None
    rewards = [h["mean_reward"] for h in history]
    table = Table(title=f"Tether demo: run {settings.run_id}")
    table.add_column("figure")
    table.add_column("value", overflow="fold")  # paths and commands whole, to copy
    table.add_row("task", demo_task.summary)
    table.add_row("trained", f"{settings.backend} backend, " + (
        f"rank-{settings.lora_rank} adapters (alpha {2 * settings.lora_rank}) on "
        f"{', '.join(settings.lora_targets) if settings.lora_targets else 'every linear layer but the head'}"
        if settings.lora_rank else "every weight"))
    table.add_row("updates", f"{len(history)} (weight version {history[-1]['version']:.0f})" if history else "0")
    if rewards:
        tail = rewards[-5:]
        table.add_row("mean reward", f"{rewards[0]:.3f} at the first update → {rewards[-1]:.3f} at the last "
                                     f"(mean of the last {len(tail)}: {sum(tail) / len(tail):.3f}; "
                                     f"≥ 0.8 at {sum(r >= 0.8 for r in rewards[-10:])} of the last "
                                     f"{len(rewards[-10:])} updates; {demo_task.chance})")
        table.add_row("per update", " ".join(f"{r:.2f}" for r in rewards))
    for setting, points in sorted(validation.items()):
        table.add_row(f"held-out ({setting})", (
            f"{settings.validation_tasks} tasks no update trained on, by version: " +
            " → ".join(f"v{v} {r:.3f}" for v, r in points)))
    if settings.validation_tasks and not validation:
        table.add_row("held-out", "no validation round was reported (see the controller's log)")
    by_version = _reward_by_version(dsn, settings.run_id)
    if by_version:
        (n0, r0), last = by_version[0], by_version[-3:]
        n_last = sum(n for n, _ in last)
        table.add_row("reward by sampling weights", (
            f"{r0:.3f} over the {n0} rollouts of the warm-started model (version 0) → "
            f"{sum(n * r for n, r in last) / max(n_last, 1):.3f} over the {n_last} of the last {len(last)} versions"))
    table.add_row("task groups trained", str(int(sum(h["task_groups"] for h in history))))
    table.add_row("calls recorded", str(sum(1 for e in outcome.events if isinstance(e, ModelCall))))
    same, pending = compare(outcome.rebuilt, stored)
    table.add_row("replay", (f"rebuilt from the topics: identical to the {len(stored)} task groups on "
                             f"tether.samples (sha256 {content_hash(stored)[:16]}...)" if same else
                             "rebuilt from the topics: DIFFERS from tether.samples")
                  + (f"; {pending} groups were still incomplete at the end" if pending else ""))
    table.add_row("time", took)
    table.add_row("plots", str(plot))
    table.add_row("checkpoint", str(latest))
    if not settings.images:  # from the images the processors sink no analytics (their image has no ClickHouse)
        table.add_row("analytics", f"tether analytics --run {settings.run_id} --dsn {dsn}")
    table.add_row("replay", f"tether replay --run {settings.run_id}   (with `tether kafka up`)")
    return table


def _reward_by_version(dsn: str, run_id: str) -> list[tuple[int, float]]:
    """(rollouts, mean reward) per weight version that sampled them, from the run's analytics sink (training
    rollouts only)."""
    from analytics.errors import AnalyticsError
    from analytics.sink import connect, query

    try:
        columns, rows = query(connect(dsn), "reward_per_version", run_id)
    except AnalyticsError:
        return []
    return [(int(row[columns.index("rollouts")]), float(row[columns.index("mean_reward")])) for row in rows]


def validation_by_version(control: list[Event]) -> dict[str, list[tuple[int, float]]]:
    """Per setting, (version, mean reward) of each held-out round, from the controller's reports on tether.control
    (a round reported twice, by a controller that restarted, counts once: its last report)."""
    last: dict[int, ValidationReported] = {}
    for event in control:
        if isinstance(event, ValidationReported):
            last[event.version] = event
    out: dict[str, list[tuple[int, float]]] = {}
    for version, report in sorted(last.items()):
        for score in report.scores:
            out.setdefault(score.setting, []).append((version, score.mean_reward))
    return out


def _train(stack: Any, settings: DemoSettings, console: Console,
           agents: subprocess.Popen[bytes]) -> list[dict[str, float]]:
    """Until the trainer has done its updates (the agents run all along); shows both as they go."""
    from trainer import checkpoint

    ckpts = stack.settings.run_dir / "checkpoints" / settings.run_id
    history: list[dict[str, float]] = []
    with Shown(console, "RL updates", settings.updates) as bar:
        while len(history) < settings.updates:
            latest = checkpoint.latest(ckpts)
            if latest is not None:
                history = checkpoint.load_state(latest).history
            h = history[-1] if history else None
            bar.update(len(history), "agents running..." if h is None else
                       f"v{h['version']:.0f} reward {h['mean_reward']:.3f} loss {h['loss']:.4f}")
            if agents.poll() is not None and stack.pid("trainer") is None:
                break  # nothing more will come
            if len(history) >= NO_SIGNAL_UPDATES and not any(h["mean_reward"] for h in history):
                console.print(f"[red]stopping: every reward of the first {len(history)} updates was 0, so GRPO has "
                              "no signal (is the warm-start producing valid tool calls?)[/red]")
                break
            time.sleep(1.0)
    return history
