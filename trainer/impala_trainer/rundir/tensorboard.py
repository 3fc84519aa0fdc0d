"""TensorBoard event files in the run directory, written without TensorFlow or tensorboard.

An event file is a TFRecord stream of `tensorflow.Event` protobufs: each record is its length
(u64), the masked CRC-32C of that length (u32), the bytes, and their masked CRC-32C (u32). A
scalar is an Event {wall_time, step, summary {value {tag, simple_value}}}. That is the whole
format TensorBoard's scalar dashboard reads, so the learner image needs no TensorBoard install:
`tensorboard --logdir RUN_DIR/tensorboard` (or the run directory's claim on a cluster) shows the
run. tests/unit/trainer/test_tensorboard.py reads the files back with TensorBoard's own loader.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path

from impala_api.snapshot import append_whole

TENSORBOARD_DIR = "tensorboard"


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum TFRecord uses."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # int64 as protobuf encodes it (negatives as 10 bytes)
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _field(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def _event(wall_time: float, step: int, *, file_version: str = "", summary: bytes = b"") -> bytes:
    """A serialized tensorflow.Event: wall_time = 1 (double), step = 2 (int64),
    file_version = 3 (string), summary = 5 (Summary)."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version:
        out += _bytes_field(3, file_version.encode())
    if summary:
        out += _bytes_field(5, summary)
    return out


def _scalar_summary(scalars: Mapping[str, float]) -> bytes:
    """Summary { repeated Value value = 1 }, Value { tag = 1, simple_value = 2 (float) }."""
    values = b""
    for tag, value in scalars.items():
        one = _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value)
        values += _bytes_field(1, one)
    return values


def _image_summary(tag: str, encoded: bytes, height: int, width: int) -> bytes:
    """Summary { Value { tag = 1, image = 4 } }, Image { height = 1, width = 2, colorspace = 3,
    encoded_image_string = 4 }: PNG or GIF bytes (TensorBoard's images dashboard animates a
    GIF, which is how an evaluation episode shows there)."""
    image = (
        _field(1, 0) + _varint(height) + _field(2, 0) + _varint(width)
        + _field(3, 0) + _varint(3) + _bytes_field(4, encoded)
    )  # fmt: skip
    return _bytes_field(1, _bytes_field(1, tag.encode()) + _bytes_field(4, image))


def _record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", _masked_crc(header))
        + data
        + struct.pack("<I", _masked_crc(data))
    )


class EventFileWriter:
    """Appends scalars to one `events.out.tfevents.*` file under `directory`.

    A resumed run writes a new file beside the old ones; TensorBoard reads them in order.
    """

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        now = time.time()
        name = f"events.out.tfevents.{int(now)}.{socket.gethostname()}"
        self.path = directory / name
        append_whole(self.path, _record(_event(now, 0, file_version="brain.Event:2")))

    def add_scalars(
        self, step: int, scalars: Mapping[str, float | None], wall_time: float | None = None
    ) -> None:
        """One event with every non-None scalar at `step`."""
        present = {tag: float(v) for tag, v in scalars.items() if v is not None}
        if not present:
            return
        event = _event(
            time.time() if wall_time is None else wall_time,
            step,
            summary=_scalar_summary(present),
        )
        append_whole(self.path, _record(event))

    def add_image(
        self, step: int, tag: str, encoded: bytes, height: int, width: int,
        wall_time: float | None = None,
    ) -> None:  # fmt: skip
        """One image (PNG, or an animated GIF) at `step`."""
        summary = _image_summary(tag, encoded, height, width)
        event = _event(time.time() if wall_time is None else wall_time, step, summary=summary)
        append_whole(self.path, _record(event))
