"""The embedded Ray of `impalajob train`, started and stopped as the command does."""

from __future__ import annotations

from typing import Any

import pytest
import ray

from impala_cli.commands import train as train_command


def test_shutdown_stops_the_autoscaler_monitor_while_the_gcs_still_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ray.shutdown alone stops the GCS first; the monitor's SIGTERM handler then reports to it
    until Ray kills the monitor a second later, at the end of every local run."""
    if ray.is_initialized():
        ray.shutdown()
    train_command._init_ray(1, 0, 1)
    node = ray._private.worker._global_node
    processes = {kind: infos[0].process for kind, infos in node.all_processes.items()}
    monitor, gcs = processes["monitor"], processes["gcs_server"]
    seen: dict[str, Any] = {}
    shutdown = ray.shutdown

    def recording_shutdown(*args: Any, **kwargs: Any) -> None:
        seen["monitor"], seen["gcs"] = monitor.poll(), gcs.poll()
        shutdown(*args, **kwargs)

    monkeypatch.setattr(ray, "shutdown", recording_shutdown)
    try:
        train_command._shutdown_ray()
    finally:
        shutdown()
    assert seen["monitor"] is not None, "the monitor was still running when Ray began stopping"
    assert seen["gcs"] is None, "the GCS was gone before the monitor"
    assert not ray.is_initialized()
    assert all(p.poll() is not None for p in processes.values()), "a Ray process outlived shutdown"
