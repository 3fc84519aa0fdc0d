"""The sidecar's run-directory reader on real files: error classes, caching, history following."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import pytest

from harness.sample_run import sample_history, sample_snapshot
from impala_api.snapshot import (
    HISTORY_FILE,
    STATUS_FILE,
    HistoryPoint,
    StatusSnapshot,
    append_history,
    write_json_atomic,
)
from impala_trainer.rundir.reader import (
    HistoryBuffer,
    HistoryFollower,
    RunDirReader,
    SnapshotError,
    SnapshotFile,
    downsample,
    parse_snapshot,
)


def _point(step: int) -> HistoryPoint:
    return HistoryPoint(time=1000.0 + step, wall_seconds=float(step), env_steps=step)


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b"", "partial"),
        (b"   \n", "partial"),
        (b'{"job": "cartpole", "phase": "Run', "partial"),
        (b'{"job": "cartpole", "counters": {"episodes": 12', "partial"),
        (b'{"job": "cartpole", "message": nu', "partial"),
        (b'{"job": "cartpole", "counters": ', "partial"),
        (b"not json at all", "corrupt"),
        (b'{"job": "x"} trailing', "corrupt"),
        (b"\xff\xfe{}", "corrupt"),
        (b"[1, 2, 3]", "invalid"),
        (b'{"phase": "Running"}', "invalid"),
        (b'{"job": "x", "phase": "Dancing"}', "invalid"),
    ],
)
def test_parse_snapshot_classifies_bad_files(raw: bytes, kind: str) -> None:
    with pytest.raises(SnapshotError) as info:
        parse_snapshot(raw, StatusSnapshot, "status.json")
    assert info.value.kind == kind
    assert info.value.file == "status.json"
    assert "status.json" in info.value.detail


def test_invalid_snapshot_names_the_field() -> None:
    with pytest.raises(SnapshotError) as info:
        parse_snapshot(b'{"job": "x", "counters": {"episodes": "many"}}', StatusSnapshot, "s")
    assert "counters.episodes" in info.value.detail


def test_snapshot_file_reparses_only_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / STATUS_FILE
    f = SnapshotFile(path, StatusSnapshot)
    with pytest.raises(SnapshotError) as info:
        f.read()
    assert info.value.kind == "missing"

    write_json_atomic(path, StatusSnapshot(job="a", iteration=1))
    first = f.read()
    assert first.iteration == 1
    assert f.read() is first  # cached: same object, no re-parse

    write_json_atomic(path, StatusSnapshot(job="a", iteration=2))
    assert f.read().iteration == 2

    path.write_text("{oops")
    with pytest.raises(SnapshotError) as info:
        f.read()
    assert info.value.kind == "partial"

    path.unlink()
    with pytest.raises(SnapshotError) as info:
        f.read()
    assert info.value.kind == "missing"


def test_missing_run_directory_is_reported(tmp_path: Path) -> None:
    reader = RunDirReader(tmp_path / "nope", 100)
    with pytest.raises(SnapshotError, match=r"run directory .* does not exist"):
        reader.status.read()
    assert reader.summary_or_none() is None


def test_history_buffer_is_bounded_and_keeps_the_start() -> None:
    buf = HistoryBuffer(64)
    for i in range(1, 100_001):
        buf.append(_point(i))
        assert len(buf) <= 64
    steps = [p.env_steps for p in buf]
    assert steps == sorted(steps)
    assert steps[0] == 1  # the overview keeps the first point of the run
    assert steps[-32:] == list(range(100_000 - 31, 100_001))  # the newest half at full resolution
    assert len(buf) >= 32 + 16


def test_downsample_keeps_ends_and_spreads_evenly() -> None:
    points = [_point(i) for i in range(1000)]
    assert downsample(points, 2000) is points
    picked = downsample(points, 11)
    assert picked[0].env_steps == 0 and picked[-1].env_steps == 999 and len(picked) == 11
    gaps = [b.env_steps - a.env_steps for a, b in itertools.pairwise(picked)]
    assert max(gaps) - min(gaps) <= 1
    assert [p.env_steps for p in downsample(points, 1)] == [999]


def test_history_follower_reads_incrementally(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    follower = HistoryFollower(path, 1000)
    with pytest.raises(SnapshotError):
        follower.refresh()

    for p in sample_history(10, start_time=0.0):
        append_history(path, p)
    assert [p.env_steps for p in follower.refresh()] == [500 * i for i in range(1, 11)]

    # A half-written line is left alone until its newline arrives.
    line = json.dumps(_point(99_999).model_dump(mode="json")) + "\n"
    with path.open("a") as f:
        f.write(line[:20])
    assert len(follower.refresh()) == 10
    with path.open("a") as f:
        f.write(line[20:])
        f.write("garbage line\n")
    buf = follower.refresh()
    assert [p.env_steps for p in buf][-1] == 99_999
    assert follower.stats.lines_read == 12 and follower.stats.skipped_lines == 1


def test_history_follower_starts_over_on_a_new_file(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    follower = HistoryFollower(path, 1000)
    for i in range(1, 6):
        append_history(path, _point(i))
    assert len(follower.refresh()) == 5
    # A new run in the same directory: the file is replaced by a shorter one.
    tmp = tmp_path / "new.jsonl"
    append_history(tmp, _point(7))
    os.replace(tmp, path)
    assert [p.env_steps for p in follower.refresh()] == [7]


def test_history_follower_skips_an_endless_line(tmp_path: Path, monkeypatch) -> None:
    import impala_trainer.rundir.reader as reader_mod

    monkeypatch.setattr(reader_mod, "_CHUNK", 512)  # small chunks so the test file stays small
    path = tmp_path / HISTORY_FILE
    append_history(path, _point(1))
    with path.open("a") as f:
        f.write("x" * 5000 + "\n")
    append_history(path, _point(2))
    follower = HistoryFollower(path, 100)
    assert [p.env_steps for p in follower.refresh()] == [1, 2]
    assert follower.stats.skipped_lines == 1


def test_history_that_is_all_garbage_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / HISTORY_FILE
    path.write_text("no\nnot this either\n")
    with pytest.raises(SnapshotError) as info:
        HistoryFollower(path, 100).refresh()
    assert info.value.kind == "corrupt"


def test_sample_snapshot_round_trips(tmp_path: Path) -> None:
    history = sample_history(5, start_time=100.0)
    snap = sample_snapshot("cartpole", history[-1], updated_at=200.0)
    write_json_atomic(tmp_path / STATUS_FILE, snap)
    assert RunDirReader(tmp_path, 100).status.read() == snap
