"""A run's updates as a picture: mean reward of the groups each update used (and the held-out validation reward
of the versions validated), and the loss."""

from __future__ import annotations

from pathlib import Path


def plot_history(history: list[dict[str, float]], out: Path, title: str,
                 validation: dict[str, list[tuple[int, float]]] | None = None) -> Path:
    """`validation`: per setting, (version, mean reward) of the held-out rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    versions = [h["version"] for h in history]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    top.plot(versions, [h["mean_reward"] for h in history], "o-", color="#3a7", label="training batch")
    for setting, points in sorted((validation or {}).items()):
        top.plot([v for v, _ in points], [r for _, r in points], "s--", label=f"held-out ({setting})")
    if validation:
        top.legend(loc="best", fontsize="small")
    top.set(ylabel="mean reward", title=title)
    bottom.plot(versions, [h["loss"] for h in history], "o-", color="#c73")
    bottom.set(xlabel="update (weight version)", ylabel="loss")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
