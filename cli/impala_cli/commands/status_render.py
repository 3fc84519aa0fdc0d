"""`impalajob status`'s output: a job's status (the sidecar's /status, or the final status a
finished job's CR keeps) as rows of (label, value), laid out as a table with rich."""

from __future__ import annotations

import sys
import time
from typing import Any

from impala_api.snapshot import duration_text
from impala_trainer.sidecar.models import StatusResponse


def final_rows(final: dict[str, Any]) -> list[tuple[str, str]]:
    """The final status as (label, value) rows (pure)."""
    p, learner = final["progress"], final["learner"]
    ret = _num(p.get("episodeReturnMean"), 2)
    rows = [
        ("Phase", f"{final['phase']}" + (f" ({final['message']})" if final["message"] else "")),
        ("Env steps sampled", _num(p.get("timesteps"))),
        ("Episodes", _num(p.get("episodes"))),
        ("Mean return (last 100)", ret),
    ]
    if p.get("evaluationReturnMean") is not None or p.get("bestEvaluationReturnMean") is not None:
        rows.append((
            "Evaluation return",
            f"{_num(p.get('evaluationReturnMean'), 2)} at {_num(p.get('evaluationTimesteps'))} "
            f"steps; best {_num(p.get('bestEvaluationReturnMean'), 2)}",
        ))  # fmt: skip
    if p.get("bestCheckpoint"):
        rows.append(("Best checkpoint", str(p["bestCheckpoint"])))
    rows.append(("Started / finished", f"{final['startTime'] or '–'} / "
                 f"{final['completionTime'] or '–'}"))  # fmt: skip
    rows.append(("Learner restarts", _num(learner.get("restarts", 0))))
    where = final["results"]
    rows.append((
        "Results",
        "; ".join(f"{k} {v}" for k, v in where.items())
        or "none kept (no checkpoint.volumeClaim or storageUri: the run directory went with "
        "the learner pod)",
    ))  # fmt: skip
    return rows


def _num(v: float | int | None, digits: int = 1) -> str:
    if v is None:
        return "–"
    return f"{v:,}" if isinstance(v, int) else f"{v:,.{digits}f}"


def _duration(seconds: float) -> str:
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def summary_rows(s: StatusResponse) -> list[tuple[str, str]]:
    """The human summary as (label, value) rows (pure; the table printer only lays them out)."""
    c, t, q, m = s.counters, s.throughput, s.learner_queue, s.membership
    ret = _num(s.episode_return_mean, 2)
    if s.episode_return_min is not None and s.episode_return_max is not None:
        ret += f"  (min {_num(s.episode_return_min, 1)}, max {_num(s.episode_return_max, 1)})"
    stop = ", ".join(f"{k} {v:g}" for k, v in s.stop.criteria.items()) or "none"
    if s.stop.policy:
        stop += f" (policy {s.stop.policy})"
    stop += f"; {s.stop.progress:.0%} done"
    if s.stop.remaining_seconds is not None and s.phase in ("Starting", "Running"):
        stop += f", ~{duration_text(s.stop.remaining_seconds)} left"
    if s.stop.stopped_by:
        stop += f"; stopped by {s.stop.stopped_by}"
    rows = [
        ("Phase", s.phase + (f" ({s.message})" if s.message else "")),
        (
            "Env steps sampled / trained",
            f"{_num(c.num_env_steps_sampled)} / {_num(c.num_env_steps_trained)}",
        ),
        ("Episodes", _num(c.episodes)),
        ("Mean return (last 100)", ret),
        ("Mean episode length", _num(s.episode_len_mean)),
        (
            "Throughput",
            f"{_num(t.env_steps_per_s)} env steps/s, "
            f"{_num(t.trained_steps_per_s)} trained/s, "
            f"{_num(t.learner_updates_per_s, 2)} updates/s",
        ),
        ("Learner updates", f"{_num(c.learner_updates)} (policy version {c.policy_version})"),
        (
            "Learner queue",
            f"fill {q.fill:.0%} ({q.size_mean:.1f}/{q.capacity}), "
            f"learner idle {q.learner_idle_fraction:.0%}, "
            f"full {c.num_times_learner_queue_full}x",
        ),
        (
            "Members",
            f"{m.rollout_workers} rollouts on {m.rollout_nodes} nodes "
            f"(busy {t.rollout_busy_fraction:.0%}), "
            f"{m.aggregator_workers} aggregators on {m.aggregator_nodes} nodes",
        ),
        ("Policy lag (mean)", _num(s.policy_lag_mean, 2)),
        *_policy_rows(s),
        ("Stop", stop),
        (
            "Last checkpoint",
            f"{s.checkpoint.path} at {_num(s.checkpoint.num_env_steps_sampled)} steps"
            if s.checkpoint
            else "none",
        ),
        ("Training time", _duration(s.wall_seconds)),
        ("Snapshot age", f"{s.age_seconds:.1f} s"),
    ]
    rows[4:4] = _evaluation_rows(s)
    if s.learner:
        rows.append(("Learner", ", ".join(f"{k} {v:.4g}" for k, v in s.learner.items())))
    if s.timing_breakdown:
        timing = ", ".join(f"{k} {v:.3g}" for k, v in s.timing_breakdown.items())
        rows.append(("Timing (ms)", timing))
    if s.summary is not None:
        rows.append(
            (
                "Summary",
                f"{s.summary.phase}: {_num(s.summary.timesteps)} steps in "
                f"{_duration(s.summary.wall_seconds)}, stopped by "
                f"{s.summary.stopped_by or '–'}",
            )
        )
    return rows


def _policy_rows(s: StatusResponse) -> list[tuple[str, str]]:
    """A multi-agent job's policies, one row each."""
    rows = []
    for name, p in s.policies.items():
        text = f"mean return {_num(p.episode_return_mean, 2)} over {_num(p.episodes)}"
        text += " agent episodes"
        if p.self_play_score is not None:
            text += f"; {p.self_play_score:.3f} against its pool ({_num(p.self_play_games)} games)"
        rows.append((f"Policy {name}", text))
    return rows


def _evaluation_rows(s: StatusResponse) -> list[tuple[str, str]]:
    """The latest evaluation (and its games against spec.evaluation.opponent)."""
    e = s.evaluation
    if e is None:
        return []
    rows = [(
        "Evaluation return",
        f"{_num(e.episode_return_mean, 2)} over {e.episodes} episodes at "
        f"{_num(e.num_env_steps_sampled)} steps; best {_num(e.best_return_mean, 2)}"
        + (f" ({e.best_checkpoint})" if e.best_checkpoint else ""),
    )]  # fmt: skip
    if e.win_rate is not None:
        rows.append((
            "Evaluation games",
            f"{e.policy} against {e.opponent}: won {e.wins}, drawn {e.draws}, lost {e.losses} "
            f"(win rate {e.win_rate:.1%})",
        ))  # fmt: skip
    return rows


def print_table(s: StatusResponse) -> None:
    """Print the summary with rich (plain text when stdout is not a terminal)."""
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.updated_at))
    print_rows(f"ImpalaJob {s.job}", summary_rows(s), f"snapshot of {updated}")


def print_rows(title: str, rows: list[tuple[str, str]], caption: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, caption=caption, show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    for label, value in rows:
        table.add_row(label, value)
    Console(width=None if sys.stdout.isatty() else 120).print(table)
