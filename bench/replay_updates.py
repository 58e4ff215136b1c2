"""A recorded run's first updates again, on each backend, from the run's starting model: what each update did
to the policy, side by side with what the run recorded.

    tether kafka up   # the run's topics
    .venv/bin/python bench/replay_updates.py --run RUN [--updates 2] [--backends torch verl]
        [--kl-coef X] [--lr X] [--epochs N] [--adam-eps X]

The groups of update v are those the run's last checkpoint says v trained (`state.json`, `trained`), read back
from `tether.samples` and selected as the trainer selects them; the settings are the run's `trainer.yaml`
unless a flag overrides one. After each update the probe is scored: the starting model's greedy first call on
the run's first held-out task (`examples/openai_agent.py`'s prompt), and the weakest token of that call under
the new weights (the one whose probability fell most). A format token falling from near 1 to near 0 is the
collapse this bench was written to see: every backend takes the same step on the same groups, so a collapse
is the update's doing, not a backend's. The run's own checkpoints are probed alongside.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, cast

import torch
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from schemas.events import TaskGroup  # noqa: E402
from schemas.samples import unique_groups  # noqa: E402
from schemas.settings import BusSettings  # noqa: E402
from tether.modules import load_file  # noqa: E402
from trainer import checkpoint  # noqa: E402
from trainer.advantages import ScoredGroups  # noqa: E402
from trainer.backend import open_backend  # noqa: E402
from trainer.checkpoint import TrainerState  # noqa: E402
from trainer.config import TrainerConfig  # noqa: E402
from trainer.selection import select  # noqa: E402


class Probe:
    """The starting model's greedy first call on one task, scored token by token under other weights."""

    def __init__(self, model: Path, task: dict[str, Any]) -> None:
        agent = load_file(ROOT / "examples" / "openai_agent.py")
        self.tok: Any = cast(Any, AutoTokenizer.from_pretrained(model))
        messages = [{"role": "system", "content": agent.SYSTEM}, {"role": "user", "content": task["question"]}]
        self.prompt: torch.Tensor = self.tok.apply_chat_template(
            messages, tools=agent.TOOLS, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        start = _load(model)
        with torch.no_grad():
            out = start.generate(self.prompt, attention_mask=torch.ones_like(self.prompt), max_new_tokens=40,
                                 do_sample=False)
        self.ids = out[:, self.prompt.shape[1]:]
        self.start = self.probs(start)

    def text(self) -> str:
        return str(self.tok.decode(self.ids[0]))

    def probs(self, model: Any) -> torch.Tensor:
        full = torch.cat([self.prompt, self.ids], 1)
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0, self.prompt.shape[1] - 1:-1], -1)
        return logp.gather(1, self.ids[0, :, None])[:, 0].exp()

    def weakest(self, folder: Path) -> str:
        now = self.probs(_load(folder))
        i = int(torch.argmax(self.start - now))
        return f"{self.tok.decode(self.ids[0, i:i + 1])!r} {float(self.start[i]):.4f}→{float(now[i]):.4f}"


def _load(folder: Path) -> Any:
    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--home", type=Path, default=Path(".tether"))
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=["torch", "verl"], choices=["torch", "verl"])
    parser.add_argument("--kl-coef", type=float)
    parser.add_argument("--lr", type=float)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--adam-eps", type=float)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    args = parser.parse_args()

    run_dir = args.home / "runs" / args.run
    settings = yaml.safe_load((run_dir / "trainer.yaml").read_text())
    given = (("kl_coef", args.kl_coef), ("lr", args.lr), ("epochs", args.epochs), ("adam_eps", args.adam_eps))
    overrides = {k: v for k, v in given if v is not None}
    latest = checkpoint.latest(run_dir / "checkpoints" / args.run)
    if latest is None:
        raise SystemExit(f"{run_dir}: no checkpoint of the run")
    state = checkpoint.load_state(latest)
    groups = {g.group_id: g for g in asyncio.run(unique_groups(BusSettings(bootstrap_servers=args.bootstrap),
                                                               args.run))}
    task = json.loads((run_dir / "held_out.jsonl").read_text().splitlines()[0])
    probe = Probe(Path(settings["model"]), task)
    print(f"run {args.run}; probe: the starting model's greedy first call on {task['id']}: {probe.text()!r}")
    shown = ("lr", "epochs", "kl_coef", "adam_eps")
    print("settings: " + ", ".join(f"{k} {overrides.get(k, settings.get(k))}" for k in shown))
    print(f"{'who':<8} {'v':>2} {'groups':>6} {'loss':>9} {'grad':>7} {'clip':>7}  weakest probe token")
    for v, row in enumerate(state.history[:args.updates], start=1):
        folder = run_dir / "checkpoints" / args.run / f"v{v:06d}"
        print(f"{'the run':<8} {v:>2} {row['task_groups']:>6.0f} {row['loss']:>9.5f} {row['grad_norm']:>7.4f} "
              f"{row['clip_fraction']:>7.4f}  {probe.weakest(folder) if folder.exists() else '(checkpoint gone)'}")
    for name in args.backends:
        replay(name, settings, overrides, state, groups, probe, args.updates)


def replay(name: str, settings: dict[str, Any], overrides: dict[str, Any], state: TrainerState,
           groups: dict[str, TaskGroup], probe: Probe, updates: int) -> None:
    names = ("model", "lr", "epochs", "mini_batches", "kl_coef", "adam_eps", "batch_groups", "workers",
             "max_staleness", "zero_variance")
    keep: dict[str, Any] = {k: settings[k] for k in names if k in settings}
    config = TrainerConfig(run_id="replay", backend=name, checkpoint_dir=Path(tempfile.mkdtemp()),
                           **{**keep, **overrides})
    backend = open_backend(config, torch.device("cpu"), None)
    out = Path(tempfile.mkdtemp())
    try:
        for v in range(1, updates + 1):
            chosen = select([groups[g] for g, x in state.trained.items() if x == v], v - 1, config.max_staleness,
                            config.zero_variance, config.advantage)
            metrics = backend.update(ScoredGroups.of(chosen.groups, config.advantage), v - 1)
            folder = backend.stage(out / f"v{v}", TrainerState(version=v))
            print(f"{name:<8} {v:>2} {len(chosen.groups):>6} {metrics.loss:>9.5f} {metrics.grad_norm:>7.4f} "
                  f"{metrics.clip_fraction:>7.4f}  {probe.weakest(folder)}", flush=True)
    finally:
        backend.close()


if __name__ == "__main__":
    main()
