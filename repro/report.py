"""`tether diverge`'s page on a terminal: the shares, who diverged first, the classes of what differed, and the
first divergences with their diffs."""

from __future__ import annotations

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from repro.diverge import Comparison


def _share(n: int, of: int) -> str:
    return f"{n}/{of} ({n / of:.0%})" if of else "0/0"


def render(comparison: Comparison, show: int = 5) -> Group:
    c = comparison
    summary = Table(title=f"{c.run_a} against {c.run_b}", show_header=False)
    summary.add_column(justify="right")
    summary.add_column()
    summary.add_row("rollouts paired", f"{c.pairs} (unpaired: {len(c.only_a)} in A, {len(c.only_b)} in B)")
    summary.add_row("identical rollouts", _share(c.identical_rollouts, c.pairs))
    summary.add_row("identical calls", _share(c.identical_calls, c.calls))
    if c.same_tokens_calls is not None:
        summary.add_row("calls the same in tokens", f"{_share(c.same_tokens_calls, c.calls)} (prompt and answer "
                        "ids, the requests equal or not: what trains)")
    summary.add_row("…logprobs to the bit", f"{_share(c.exact_calls, c.identical_calls)} (largest drift "
                    f"{c.max_logprob_drift:.2e})")
    sides = c.sides()
    summary.add_row("diverged first", ", ".join(f"{side} {sides[side]}" for side in ("harness", "engine")))
    if c.training is not None:
        same = "equal" if c.training[0] == c.training[1] else "different"
        summary.add_row("training data", f"{same} (sha256 {c.training[0][:16]} / {c.training[1][:16]})")
    summary.add_row("at call", ", ".join(f"#{k}: {v}" for k, v in sorted(c.first_calls().items())) or "-")
    classes = Table(title="What differed where they diverged (divergences showing each class)")
    classes.add_column("class")
    classes.add_column("divergences", justify="right")
    for kind, n in c.span_classes().most_common():
        classes.add_row(kind, str(n))
    parts: list[Table | Text] = [summary, classes]
    for d in c.divergences[:show]:
        parts.append(Text(f"\n{d.task_id} (seed {d.seed}): call #{d.call}, the {d.side} first: {d.why}",
                          style="bold"))
        for span in d.spans[:8]:
            parts.append(Text(f"  {span.kind}: {span.a[:80]!r} → {span.b[:80]!r}"))
        for line in d.diff[:40]:
            style = "red" if line.startswith("-") else "green" if line.startswith("+") else "dim"
            parts.append(Text(line[:200], style=style))
    if len(c.divergences) > show:
        parts.append(Text(f"\n... {len(c.divergences) - show} more (--show N, or --json)"))
    return Group(*parts)


def show(comparison: Comparison, console: Console, count: int = 5) -> None:
    console.print(render(comparison, count))
