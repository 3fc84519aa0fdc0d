"""`impalajob status`'s table: what a multi-agent job's rows say (each policy, the games of the
evaluation, the policy a stop criterion measures)."""

from __future__ import annotations

from impala_api.snapshot import EvaluationInfo, PolicyStatus, StopProgress
from impala_cli.commands.status_render import summary_rows
from impala_trainer.sidecar.models import StatusResponse


def test_a_multi_agent_jobs_rows_name_each_policy_and_the_games() -> None:
    status = StatusResponse(
        job="ttt",
        policies={
            "main": PolicyStatus(episode_return_mean=0.25, episodes=400, self_play_score=0.625,
                                 self_play_games=200),
            "fixed": PolicyStatus(episode_return_mean=-0.5, episodes=200),
        },
        evaluation=EvaluationInfo(evaluations=2, episodes=100, episode_return_mean=0.8,
                                  opponent="random", policy="main", wins=88, draws=4,
                                  losses=8, win_rate=0.88),
        stop=StopProgress(criteria={"episodeReturnMean": 0.5}, progress=0.5, policy="main"),
    )  # fmt: skip
    rows = dict(summary_rows(status))
    assert rows["Policy main"] == (
        "mean return 0.25 over 400 agent episodes; 0.625 against its pool (200 games)"
    )
    assert rows["Policy fixed"] == "mean return -0.50 over 200 agent episodes"
    assert rows["Evaluation games"] == (
        "main against random: won 88, drawn 4, lost 8 (win rate 88.0%)"
    )
    assert rows["Stop"] == "episodeReturnMean 0.5 (policy main); 50% done"


def test_the_stop_row_tells_the_time_left_while_the_job_runs() -> None:
    stop = StopProgress(criteria={"timesteps": 1e6}, progress=0.25, foreseeable=0.25,
                        remaining_seconds=3900)  # fmt: skip
    running = StatusResponse(job="cp", phase="Running", stop=stop)
    assert dict(summary_rows(running))["Stop"] == "timesteps 1e+06; 25% done, ~1h05m left"
    ended = StatusResponse(job="cp", phase="Stopped", stop=stop)
    assert dict(summary_rows(ended))["Stop"] == "timesteps 1e+06; 25% done"
