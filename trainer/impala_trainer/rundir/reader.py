"""Reading a run directory robustly: cached snapshots, typed errors, incremental history.

No web framework here: the routers turn `SnapshotError` into a 503. Every request stats the file
(microseconds) and re-parses only when its identity (inode, mtime, size) changed, so a poll-heavy
client costs no JSON parsing. Reads happen on the event loop: the files are small and local, and a
thread-pool hop would cost more than the read.
"""

from __future__ import annotations

import json
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from impala_api.snapshot import (
    HISTORY_FILE,
    STATUS_FILE,
    SUMMARY_FILE,
    HistoryPoint,
    StatusSnapshot,
    Summary,
)

ErrorKind = Literal["missing", "partial", "corrupt", "invalid", "unreadable", "stale"]
M = TypeVar("M", bound=BaseModel)

# Bounds the memory of one history refresh, however large the file is on first read.
_CHUNK = 4 << 20


class SnapshotError(Exception):
    """A run-directory file that cannot be served; `kind` says why, `detail` says what to do."""

    def __init__(self, kind: ErrorKind, file: str, detail: str) -> None:
        super().__init__(f"{file}: {detail}")
        self.kind: ErrorKind = kind
        self.file = file
        self.detail = detail


def parse_snapshot(raw: bytes, model: type[M], name: str) -> M:
    """Parse one JSON snapshot file, classifying failures as partial, corrupt or invalid."""
    text = raw.strip()
    if not text:
        raise SnapshotError("partial", name, f"{name} is empty (a write in progress?)")
    try:
        data = json.loads(text)
    except UnicodeDecodeError as err:
        raise SnapshotError("corrupt", name, f"{name} is not UTF-8 text: {err.reason}") from err
    except json.JSONDecodeError as err:
        # A cut-off write fails at its very end (or inside a string or literal running to the
        # end); an error earlier in the text, or extra data after it, is damage.
        at_end = err.pos >= len(text.decode(errors="replace")) - len("false")
        cut_off = err.msg.startswith("Unterminated string") or at_end
        if text.startswith(b"{") and cut_off and err.msg != "Extra data":
            raise SnapshotError(
                "partial", name, f"{name} is truncated after {len(raw)} bytes ({err.msg})"
            ) from err
        raise SnapshotError(
            "corrupt",
            name,
            f"{name} is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}",
        ) from err
    if not isinstance(data, dict):
        raise SnapshotError(
            "invalid", name, f"{name} holds a JSON {type(data).__name__}, expected an object"
        )
    try:
        return model.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in err.errors()[:3]
        )
        more = f" (+{err.error_count() - 3} more)" if err.error_count() > 3 else ""
        raise SnapshotError(
            "invalid", name, f"{name} does not match {model.__name__}: {problems}{more}"
        ) from err


def _stat(path: Path, name: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SnapshotError("unreadable", name, f"cannot stat {name}: {err.strerror}") from err


def _missing(path: Path, name: str) -> SnapshotError:
    where = path.parent
    if not where.is_dir():
        return SnapshotError("missing", name, f"run directory {where} does not exist (yet)")
    return SnapshotError("missing", name, f"{name} does not exist yet in {where}")


class SnapshotFile(Generic[M]):
    """One JSON file parsed into `model`, re-parsed only when the file changes."""

    def __init__(self, path: Path, model: type[M]) -> None:
        self.path = path
        self.model = model
        self.name = path.name
        self.key: tuple[int, int, int] | None = None
        """(inode, mtime_ns, size) of the cached parse; also a cheap ETag for derived caches."""
        self.mtime = 0.0
        self._value: M | None = None
        self._error: SnapshotError | None = None

    def read(self) -> M:
        """The parsed file; raises `SnapshotError` when it is missing or bad."""
        value = self.read_optional()
        if value is None:
            raise _missing(self.path, self.name)
        return value

    def read_optional(self) -> M | None:
        """Like `read`, but None when the file does not exist (cheap: no exception built)."""
        st = _stat(self.path, self.name)
        if st is None:
            self.key, self._value, self._error = None, None, None
            return None
        if (st.st_ino, st.st_mtime_ns, st.st_size) != self.key:
            self._load()
        if self._error is not None:
            raise self._error
        return self._value  # None only if the file vanished between stat and open

    def _load(self) -> None:
        try:
            # Key the cache by the opened file's own fstat, so a rename racing with us can only
            # cause one extra parse, never a stale value under a new key.
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                raw = f.read()
        except FileNotFoundError:
            self.key, self._value, self._error = None, None, None
            return
        except OSError as err:
            self.key, self._value = None, None
            self._error = SnapshotError("unreadable", self.name, f"cannot read: {err.strerror}")
            return
        self.key, self.mtime = (st.st_ino, st.st_mtime_ns, st.st_size), st.st_mtime
        try:
            self._value, self._error = parse_snapshot(raw, self.model, self.name), None
        except SnapshotError as err:
            # Cache the failure too: a corrupt file must not be re-parsed on every request.
            self._value, self._error = None, err


class HistoryBuffer:
    """A bounded ring of history points that thins, rather than forgets, what falls off it.

    The newest half of `max_points` is a ring at full resolution. Points evicted from it go to an
    overview that keeps every `stride`-th one and halves itself (doubling `stride`) when full, so
    the plot still starts at step 0 after a week of training, in memory that never grows.
    """

    def __init__(self, max_points: int) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self._recent: deque[HistoryPoint] = deque(maxlen=max_points - max_points // 2)
        self._overview: list[HistoryPoint] = []
        self._overview_cap = max_points // 2
        self._stride = 1
        self._evicted = 0

    def append(self, point: HistoryPoint) -> None:
        """Add the newest point."""
        if len(self._recent) == self._recent.maxlen:
            oldest = self._recent[0]
            if self._evicted % self._stride == 0:
                self._overview.append(oldest)
                if len(self._overview) >= self._overview_cap:
                    self._overview = self._overview[::2]
                    self._stride *= 2
            self._evicted += 1
        self._recent.append(point)

    def __len__(self) -> int:
        return len(self._overview) + len(self._recent)

    def __iter__(self) -> Iterator[HistoryPoint]:
        yield from self._overview
        yield from self._recent


def downsample(points: list[HistoryPoint], limit: int) -> list[HistoryPoint]:
    """At most `limit` points spread evenly over `points`, always keeping the first and last."""
    n = len(points)
    if n <= limit:
        return points
    if limit == 1:
        return [points[-1]]
    return [points[round(i * (n - 1) / (limit - 1))] for i in range(limit)]


@dataclass
class HistoryStats:
    lines_read: int = 0
    """Complete lines consumed from history.jsonl."""
    skipped_lines: int = 0
    """Lines that were not a valid HistoryPoint (counted, not served)."""


class HistoryFollower:
    """Follows history.jsonl by byte offset, like `tail -f`, into a `HistoryBuffer`."""

    def __init__(self, path: Path, max_points: int) -> None:
        self.path = path
        self.max_points = max_points
        self._reset(None)

    def _reset(self, inode: int | None) -> None:
        self.buffer = HistoryBuffer(self.max_points)
        self.stats = HistoryStats()
        self._inode = inode
        self._offset = 0
        self._discarding = False  # inside an over-long line whose end we have not seen yet

    def refresh(self) -> HistoryBuffer:
        """Read lines appended since the last call; raises `SnapshotError` if there is no file."""
        name = self.path.name
        st = _stat(self.path, name)
        if st is None:
            self._reset(None)
            raise _missing(self.path, name)
        if st.st_ino != self._inode or st.st_size < self._offset:
            # A new file (new run in the directory) or a truncated one: start over.
            self._reset(st.st_ino)
        if st.st_size > self._offset:
            try:
                with open(self.path, "rb") as f:
                    while True:
                        f.seek(self._offset)  # a chunk's unfinished last line is read again
                        if not self._read_chunk(f.read(_CHUNK)):
                            break
            except OSError as err:
                raise SnapshotError("unreadable", name, f"cannot read: {err.strerror}") from err
        if self.stats.lines_read and not len(self.buffer):
            raise SnapshotError(
                "corrupt", name, f"none of the {self.stats.lines_read} lines is a HistoryPoint"
            )
        return self.buffer

    def _read_chunk(self, chunk: bytes) -> bool:
        """Consume the complete lines of `chunk`; returns False when there is nothing more."""
        if not chunk:
            return False
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) < _CHUNK:
                return False  # a partial last line: leave it until the writer finishes it
            # A line longer than a whole chunk is garbage; skip it without holding it in memory.
            self._offset += len(chunk)
            self._discarding = True
            return True
        self._offset += end + 1
        lines = chunk[:end].split(b"\n")
        if self._discarding:
            self._discarding = False
            lines = lines[1:]
            self.stats.lines_read += 1
            self.stats.skipped_lines += 1
        for line in lines:
            if not line.strip():
                continue
            self.stats.lines_read += 1
            try:
                self.buffer.append(HistoryPoint.model_validate_json(line))
            except ValidationError:
                self.stats.skipped_lines += 1
        return len(chunk) == _CHUNK


class RunDirReader:
    """Everything the sidecar reads from one run directory."""

    def __init__(self, run_dir: Path, history_max_points: int) -> None:
        self.run_dir = run_dir
        self.status = SnapshotFile(run_dir / STATUS_FILE, StatusSnapshot)
        self.summary = SnapshotFile(run_dir / SUMMARY_FILE, Summary)
        self.history = HistoryFollower(run_dir / HISTORY_FILE, history_max_points)

    def summary_or_none(self) -> Summary | None:
        """summary.json is written only at the end: missing is normal, damage still raises."""
        return self.summary.read_optional()
