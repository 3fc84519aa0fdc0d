"""A direct connection between the driver and one rollout actor, for small samples.

Each sample request as a Ray actor call costs ~0.85 ms of CPU across the driver, the actor and
Ray's threads (`bench/ray_calls.py`: 1.65 CPU-ms per request with 0.8 ms of work, against
0.85-0.87 over a TCP connection), about what sampling a CartPole example's 128-step fragment
costs.
So where a request's weights and its fragment are small, the driver opens a TCP connection to
each rollout actor's process (the actor connects to the driver's listener, the address given by
a Ray call) and sends requests on it; Ray still places, starts, watches and kills the actors.

Messages are length-prefixed pickles. The actor's first bytes are the secret token the driver gave
it through Ray, so the driver unpickles nothing from a connection that has not presented one; the
actor trusts the address Ray told it.

This module is both ends' framing and the actor's loop; the driver's end is
`driver/channels.py`.
"""

from __future__ import annotations

import pickle
import socket
import struct
import traceback
from collections.abc import Callable
from typing import Any

TOKEN_BYTES = 32
_HEADER = struct.Struct("!Q")

STOP = None
"""The request that ends an actor's loop (the driver then makes Ray calls on it again)."""


class ChannelClosed(ConnectionError):
    """The other end closed the connection (or it broke) in the middle of a message."""


def no_delay(sock: socket.socket) -> None:
    """Send small messages at once: Nagle's algorithm would hold a request back until the previous
    reply's ACK, which a delayed ACK takes ~40 ms to send."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def frame(obj: Any) -> bytes:
    """`obj` as one message: its pickle, prefixed with the pickle's length."""
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(body)) + body


def unframe(buffer: bytearray) -> list[Any]:
    """The whole messages at the start of `buffer`, which keeps only the bytes after them (the
    start of a message still arriving)."""
    messages = []
    start = 0
    view = memoryview(buffer)
    while len(buffer) - start >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer, start)
        end = start + _HEADER.size + size
        if len(buffer) < end:
            break
        messages.append(pickle.loads(view[start + _HEADER.size : end]))
        start = end
    view.release()
    del buffer[:start]
    return messages


def send_message(sock: socket.socket, obj: Any) -> None:
    """One message, in one send call."""
    sock.sendall(frame(obj))


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """`n` bytes, or ChannelClosed if the connection ends first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelClosed(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_message(sock: socket.socket) -> Any:
    """The next message (blocking until it is whole)."""
    (size,) = _HEADER.unpack(recv_exactly(sock, _HEADER.size))
    return pickle.loads(recv_exactly(sock, size))


def serve(address: tuple[str, int], token: bytes, sample: Callable[..., Any]) -> int:
    """The actor's end: connect, present `token`, then answer each request `(weights, version)`
    with `sample(weights, version)` until STOP or the connection ends; -> requests answered.

    A request that raises is answered with `("error", traceback)` and ends the loop: the driver
    treats it as Ray treats a task that raised (the actor is replaced)."""
    served = 0
    with socket.create_connection(address, timeout=60.0) as sock:
        sock.settimeout(None)  # an actor waits for requests as long as the driver lives
        no_delay(sock)
        sock.sendall(token)
        try:
            while (request := recv_message(sock)) is not STOP:
                try:
                    reply = ("ok", sample(*request))
                except Exception:
                    send_message(sock, ("error", traceback.format_exc()))
                    break
                send_message(sock, reply)
                served += 1
        except OSError:  # ChannelClosed too: the driver went away, or dropped this actor
            pass
    return served
