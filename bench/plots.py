"""matplotlib figures for docs/benchmarks.md (Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLOURS = {"ours": "tab:blue", "rllib": "tab:orange", "rllib_old": "tab:green"}
LABELS = {
    "ours": "ImpalaJob (ours)",
    "rllib": "RLlib IMPALA (new API stack)",
    "rllib_old": "RLlib IMPALA (old API stack)",
}


def plot_return_curves(
    trials: dict[str, list[dict[str, Any]]], threshold: float, path: Path, title: str
) -> None:
    """Return mean vs seconds since launch, one line per run, a colour per side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for side, runs in trials.items():
        for i, run in enumerate(runs):
            pts = [p for p in run.get("points", []) if p[4] is not None]
            if not pts:
                continue
            ax.plot(
                [p[0] for p in pts],
                [p[4] for p in pts],
                color=COLOURS.get(side, "tab:gray"),
                alpha=0.85,
                linewidth=1.4,
                label=LABELS.get(side, side) if i == 0 else None,
            )
    ax.axhline(threshold, color="black", linestyle="--", linewidth=0.8, label=f"{threshold:g}")
    ax.set_xlabel("seconds since launch (Python, Ray and actor start-up included)")
    ax.set_ylabel("100-episode mean return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
