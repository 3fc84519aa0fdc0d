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


def plot_steps_and_time(
    trials: dict[str, list[dict[str, Any]]],
    labels: dict[str, str],
    baseline: float | None,
    path: Path,
    title: str,
) -> None:
    """Trials' return curves against env steps (left) and seconds of training (right), a colour
    per side; `baseline` (acting at random) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110, sharey=True)
    for side, runs in trials.items():
        for i, run in enumerate(runs):
            pts = [p for p in run.get("points", []) if p[4] is not None]
            style = dict(color=COLOURS.get(side, "tab:gray"), alpha=0.85, linewidth=1.4,
                         label=labels.get(side, side) if i == 0 else None)  # fmt: skip
            by_steps.plot([p[2] / 1e6 for p in pts], [p[4] for p in pts], **style)
            by_time.plot([p[1] / 60 for p in pts], [p[4] for p in pts], **style)
    by_steps.set_xlabel("env steps (millions)")
    by_steps.set_ylabel("mean return, last 100 episodes")
    by_time.set_xlabel("training wall time (minutes)")
    for ax in (by_steps, by_time):
        if baseline is not None:
            ax.axhline(baseline, color="black", linestyle="--", linewidth=0.8,
                       label="random actions")  # fmt: skip
        ax.grid(alpha=0.3)
    by_time.legend(loc="best")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_run_history(history: Path, threshold: float, path: Path, title: str) -> None:
    """One run's learning curve from its history.jsonl: 100-episode mean return against env
    steps (left) and against training wall time (right)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in history.read_text().splitlines() if line.strip()]
    pts = [r for r in rows if r.get("episode_return_mean") is not None]
    returns = [r["episode_return_mean"] for r in pts]
    fig, (by_steps, by_time) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110, sharey=True)
    by_steps.plot([r["env_steps"] / 1e6 for r in pts], returns, color=COLOURS["ours"])
    by_steps.set_xlabel("env steps (millions; 4 frames each)")
    by_steps.set_ylabel("mean return, last 100 episodes")
    by_time.plot([r["wall_seconds"] / 60 for r in pts], returns, color=COLOURS["ours"])
    by_time.set_xlabel("training wall time (minutes)")
    for ax in (by_steps, by_time):
        ax.axhline(threshold, color="black", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="plot a run directory's learning curve")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--threshold", type=float, required=True)
    parser.add_argument("--title", default="")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    plot_run_history(args.run_dir / "history.jsonl", args.threshold, args.output, args.title)
