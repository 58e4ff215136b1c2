"""The behaviour check: the function a task's bug is in, called on inputs the agent has never seen, its outcomes
compared with the original's outside the graded process (docs/architecture.md, "The grader's threat model").

Tests alone cannot settle a grade: their verdicts are reached inside the
process the graded code runs in, which can change them, and a fix can be
special-cased to the visible tests' inputs. So `tether swe build` records,
while the clean tree's tests run, the arguments of every call to the
function (`swe.recorder`), adds variants of them no test uses
(`swe.variation`), and has the clean tree and the buggy one answer each
(`swe/replay.py`, a process of its own). It keeps the inputs the original
answers the same way twice, with its answers, in the private data. Grading
has the graded copy answer the same inputs in its jail: reward 1 needs every
answer equal to the original's. The graded process only prints its answers;
the comparison happens here. To pass, it has to answer inputs it never saw
as the original does: it has to be fixed.

    DIR/private/behaviour/ID.json   module, function, calls (base64 pickles), expected answers, figures
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from swe.isolate import jailed
from swe.scratch import scratch
from swe.testrun import (
    BASE_ENV,
    TETHER_ROOT,
    clean_environment,
    import_roots,
    limit_files,
    network_isolation,
    run_tests,
)

REPLAY = Path(__file__).with_name("replay.py")
#: per function: recorded calls kept (and twice as many variants at most), variants made of each, inputs
#: checked at most; per call: seconds, items
MAX_CALLS, VARIANTS_PER_CALL, MAX_INPUTS, CALL_TIMEOUT_S, MAX_ITEMS = 200, 8, 160, 2.0, 1000
#: what the replay may print: its answers are at most 64 KiB each
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
#: an answer that says the input could not be tried: not an input to check on
UNUSABLE = ('{"timed out"', '{"unpickled"', '{"missing"', '{"unwritable"')


@dataclass(frozen=True, slots=True, kw_only=True)
class Checks:
    """One task's behaviour check, as the private data holds it."""
    module: str
    function: str
    calls: list[str]  # base64 of pickled (args, kwargs)
    expected: list[str]  # the original's answer to each, canonical JSON
    seen: int  # how many of the calls are the tests' own (the first ones); the rest are variants
    telling: int  # variants the buggy tree answers unlike the original: what catches a special-cased fix
    telling_seen: int  # the tests' own calls it answers unlike the original

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self)) + "\n")

    @classmethod
    def load(cls, path: Path) -> Checks | None:
        return cls(**json.loads(path.read_text())) if path.exists() else None


def checks_path(tasks: Path, instance_id: str) -> Path:
    return tasks / "private" / "behaviour" / f"{instance_id}.json"


def module_of(file: str) -> str:
    """`toolz/itertoolz.py` → `toolz.itertoolz` (a src layout's `src/` dropped)."""
    parts = list(Path(file).with_suffix("").parts)
    if parts[0] == "src":
        parts = parts[1:]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def record(base: Path, targets: Sequence[tuple[str, str]], *, timeout_s: float,
           seed: int = 0) -> dict[tuple[str, str], tuple[list[bytes], list[bytes]]]:
    """(file, qualname) → (the calls the clean tree's tests make to it, variants of them), from one run of its
    whole suite with `swe.recorder` loaded."""
    with tempfile.TemporaryDirectory(prefix="tether-swe-record-") as scratch:
        out = Path(scratch) / "calls.pickle"
        spec = {"targets": [[str((base / file).resolve()), name] for file, name in targets], "out": str(out),
                "max_calls": MAX_CALLS, "variants_per_call": VARIANTS_PER_CALL, "seed": seed}
        run_tests(base, timeout_s=timeout_s, plugins=["swe.recorder"], env={"TETHER_RECORD": json.dumps(spec)})
        if not out.exists():
            return {}
        found = pickle.loads(out.read_bytes())  # written by the plugin, in the clean tree's run
    return {(file, name): (found[f"{(base / file).resolve()}::{name}"]["seen"],
                           found[f"{(base / file).resolve()}::{name}"]["variants"])
            for file, name in targets if f"{(base / file).resolve()}::{name}" in found}


@dataclass(frozen=True, slots=True)
class Answers:
    lines: list[str | None]  # per call, its canonical JSON (None: no answer)
    problem: str | None = None  # why the run gave no usable answers (timed out, no jail), if it did not


def replay(tree: Path, module: str, function: str, calls: Sequence[bytes], *, timeout_s: float,
           hide: Sequence[Path] = (), unhidden_ok: bool = False, python: str = sys.executable) -> Answers:
    """`tree`'s answers to `calls` of `module.function`, from a process of its own: in the jail when `hide` is
    given (as graded tests run), with no network where a namespace can be made."""
    nonce = secrets.token_hex(16)
    job = pickle.dumps({"nonce": nonce, "module": module, "function": function, "calls": list(calls),
                        "timeout_s": CALL_TIMEOUT_S, "max_items": MAX_ITEMS})
    with scratch("tether-swe-replay-") as private:
        home = Path(private) / "home"
        home.mkdir()
        command = [*network_isolation(), python, "-P", str(REPLAY)]
        if hide:
            jail = jailed(command, work=tree, out=Path(private), hide=hide, python=python)
            if jail is None and not unhidden_ok:
                return Answers([None] * len(calls), "no jail can be made here for the behaviour check")
            command = jail or command
        env = {**clean_environment(), **BASE_ENV, "HOME": str(home), "PYTHONHASHSEED": "0",
               "PYTHONPATH": os.pathsep.join(map(str, [*import_roots(tree), TETHER_ROOT]))}
        # the answers go to a file of the grader's, which the process can fill to a limit and no further
        with tempfile.TemporaryFile() as out:
            try:
                done = subprocess.run(command, cwd=tree, env=env, input=job, stdout=out, stderr=subprocess.DEVNULL,
                                      timeout=timeout_s, check=False, preexec_fn=limit_files(MAX_OUTPUT_BYTES))
            except subprocess.TimeoutExpired:
                return Answers([None] * len(calls), f"the behaviour check timed out after {timeout_s:.0f} s")
            out.seek(0)
            printed = out.read(MAX_OUTPUT_BYTES)
    answers = [line.partition(b"\t")[2].decode(errors="replace") for line in printed.splitlines()
               if line.startswith(nonce.encode() + b"\t")]
    if len(answers) != len(calls):
        return Answers([*answers[:len(calls)], *[None] * (len(calls) - len(answers))][:len(calls)],
                       f"the behaviour check answered {len(answers)} of {len(calls)} calls"
                       f" (exit status {done.returncode})")
    return Answers(list(answers))


def prepare(base: Path, buggy: Path, file: str, function: str, seen: Sequence[bytes], variants: Sequence[bytes],
            *, timeout_s: float) -> Checks | None:
    """The check for one task: the inputs the original (`base`) answers the same way twice, at most
    `MAX_INPUTS` (the tests' own calls first), with those answers; None when there is none."""
    module = module_of(file)
    calls = [*seen, *variants]
    first = replay(base, module, function, calls, timeout_s=timeout_s)
    again = replay(base, module, function, calls, timeout_s=timeout_s)
    bug = replay(buggy, module, function, calls, timeout_s=timeout_s)
    kept: list[tuple[int, bytes, str, bool]] = []
    for n, (call, a, b, c) in enumerate(zip(calls, first.lines, again.lines, bug.lines, strict=True)):
        if a is not None and a == b and not a.startswith(UNUSABLE):
            kept.append((n, call, a, a != c))
    # the tests' own calls, then the variants that tell the bug apart, then the rest, up to the limit
    chosen = sorted([k for k in kept if k[0] < len(seen)][:MAX_INPUTS // 4]
                    + sorted((k for k in kept if k[0] >= len(seen)), key=lambda k: not k[3])[:MAX_INPUTS * 3 // 4])
    if not chosen:
        return None
    return Checks(module=module, function=function,
                  calls=[base64.b64encode(k[1]).decode() for k in chosen], expected=[k[2] for k in chosen],
                  seen=sum(k[0] < len(seen) for k in chosen), telling=sum(k[3] for k in chosen if k[0] >= len(seen)),
                  telling_seen=sum(k[3] for k in chosen if k[0] < len(seen)))


def check(tree: Path, checks: Checks, *, timeout_s: float, hide: Sequence[Path],
          unhidden_ok: bool = False) -> str | None:
    """Why `tree`'s function does not behave as the original on the check's inputs, or None when it does."""
    calls = [base64.b64decode(c) for c in checks.calls]
    answers = replay(tree, checks.module, checks.function, calls, timeout_s=timeout_s, hide=hide,
                     unhidden_ok=unhidden_ok)
    if answers.problem is not None:
        return answers.problem
    differ = [n for n, (got, want) in enumerate(zip(answers.lines, checks.expected, strict=True)) if got != want]
    if not differ:
        return None
    first = differ[0]
    kind = "a call the tests make" if first < checks.seen else "an input no test uses"
    return (f"{checks.function} answers {len(differ)} of {len(calls)} inputs unlike the original; first, on "
            f"{kind}, it gave {_short(answers.lines[first])} where the original gives {_short(checks.expected[first])}")


def _short(answer: str | None, limit: int = 160) -> str:
    text = "no answer" if answer is None else answer
    return text if len(text) <= limit else text[:limit] + "..."
