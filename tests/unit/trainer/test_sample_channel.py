"""The direct sample connection's framing and the actor's serve loop (`rollouts/channel.py`),
which jobs use it (`driver.impala.direct_samples`) and the port the driver listens on. The
driver's end, with Ray's actors: tests/integration/test_sample_channels.py."""

from __future__ import annotations

import socket
import threading
from typing import Any

import numpy as np
import pytest

from impala_api.manifest import load_manifest
from impala_api.roles import LEARNER_PORTS, SAMPLE_PORT_ENV
from impala_trainer.driver.channels import SampleChannels
from impala_trainer.driver.impala import INLINE_WEIGHTS_BYTES, direct_samples
from impala_trainer.node.ray_node import free_port, pinned_port
from impala_trainer.rollouts import channel


def test_messages_cross_whole_however_the_bytes_arrive() -> None:
    a, b = socket.socketpair()
    with a, b:
        big = np.arange(600_000, dtype=np.float32)  # 2.4 MB: many recv calls
        sender = threading.Thread(target=lambda: channel.send_message(a, {"x": big, "n": 3}))
        sender.start()
        got = channel.recv_message(b)
        sender.join()
        assert got["n"] == 3 and np.array_equal(got["x"], big)


def test_unframe_takes_the_whole_messages_and_keeps_the_rest() -> None:
    stream = b"".join(channel.frame(m) for m in ("a", {"b": 2}, None, "last"))
    buffer = bytearray()
    got: list[Any] = []
    for i in range(0, len(stream), 5):  # the bytes in 5-byte pieces, as a socket may give them
        buffer += stream[i : i + 5]
        got += channel.unframe(buffer)
        assert len(buffer) < len(stream)
    assert got == ["a", {"b": 2}, None, "last"] and buffer == bytearray()


def test_a_connection_closed_mid_message_is_channel_closed() -> None:
    a, b = socket.socketpair()
    with b:
        a.sendall((100).to_bytes(8, "big") + b"only part")
        a.close()
        with pytest.raises(channel.ChannelClosed, match="after 9 of 100 bytes"):
            channel.recv_message(b)


def _driver_side(requests: list[Any]) -> tuple[bytes, list[Any], threading.Thread, list[int]]:
    """Play the driver: listen, let `serve` connect in a thread, send `requests`, read replies."""
    listener = socket.create_server(("127.0.0.1", 0))
    token = b"t" * channel.TOKEN_BYTES
    served: list[int] = []
    calls: list[tuple[Any, int]] = []

    def sample(weights: Any, version: int) -> tuple[Any, int]:
        calls.append((weights, version))
        if weights == "boom":
            raise ValueError("the env broke")
        return (f"fragment {len(calls)}", version)

    actor = threading.Thread(
        target=lambda: served.append(channel.serve(listener.getsockname(), token, sample))
    )
    actor.start()
    conn, _ = listener.accept()
    listener.close()
    with conn:
        presented = channel.recv_exactly(conn, channel.TOKEN_BYTES)
        for request in requests:  # all sent before any reply is read: requests in flight
            channel.send_message(conn, request)
        replies = []
        for request in requests:
            if request is channel.STOP:
                break
            replies.append(channel.recv_message(conn))
            if replies[-1][0] == "error":
                break
        actor.join(timeout=10)
    return presented, replies, actor, served


def test_serve_answers_requests_in_order_until_stop() -> None:
    token, replies, actor, served = _driver_side([(b"w", 3), (None, 3), channel.STOP])
    assert token == b"t" * channel.TOKEN_BYTES  # presented before anything else
    assert replies == [("ok", ("fragment 1", 3)), ("ok", ("fragment 2", 3))]
    assert not actor.is_alive() and served == [2]


def test_a_sample_that_raises_is_answered_with_its_traceback_and_ends_the_loop() -> None:
    _, replies, actor, served = _driver_side([(None, 0), ("boom", 1), (None, 1)])
    assert replies[0] == ("ok", ("fragment 1", 0))
    status, text = replies[1]
    assert status == "error" and "ValueError: the env broke" in text
    assert not actor.is_alive() and served == [1]  # the third request is never served


def test_serve_ends_quietly_when_the_driver_goes_away() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    served: list[int] = []
    actor = threading.Thread(
        target=lambda: served.append(
            channel.serve(listener.getsockname(), b"t" * channel.TOKEN_BYTES, lambda *a: a)
        )
    )
    actor.start()
    conn, _ = listener.accept()
    conn.close()
    listener.close()
    actor.join(timeout=10)
    assert not actor.is_alive() and served == [0]


@pytest.mark.parametrize(
    ("example", "overrides", "obs_shape", "dtype", "weights", "direct"),
    [
        ("cartpole", [], (4,), np.float32, 20_000, True),
        ("cartpole", ["spec.rollouts.transport=ray"], (4,), np.float32, 20_000, False),
        # the CNN's weights go by reference through Ray's object store
        ("pong", [], (4, 84, 84), np.uint8, 6_500_000, False),
        # small weights, but 26 x 10 Atari frames: 7 MB a fragment
        ("pong", [], (4, 84, 84), np.uint8, INLINE_WEIGHTS_BYTES, False),
    ],
)
def test_which_jobs_sample_over_direct_connections(
    example: str,
    overrides: list[str],
    obs_shape: tuple[int, ...],
    dtype: type,
    weights: int,
    direct: bool,
) -> None:
    spec = load_manifest(f"manifests/examples/{example}.yaml", overrides).spec
    assert direct_samples(spec, obs_shape, np.dtype(dtype), weights) is direct


def test_the_driver_listens_on_the_port_its_pod_pins(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a learner pod the operator pins the sample port (roles.LearnerPorts, which the job's
    NetworkPolicy opens); where nothing pins it the listener takes a free port."""
    monkeypatch.setenv(SAMPLE_PORT_ENV, str(LEARNER_PORTS.samples))
    assert pinned_port(SAMPLE_PORT_ENV) == LEARNER_PORTS.samples
    monkeypatch.delenv(SAMPLE_PORT_ENV)
    assert pinned_port(SAMPLE_PORT_ENV) == 0
    port = free_port()
    channels = SampleChannels("127.0.0.1", port)
    try:
        assert channels.address == ("127.0.0.1", port)
    finally:
        channels.close()
    channels = SampleChannels("127.0.0.1")
    try:
        assert channels.address[1] > 0
    finally:
        channels.close()
