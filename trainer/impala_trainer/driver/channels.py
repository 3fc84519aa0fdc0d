"""The driver's end of the direct sample connections (`rollouts/channel.py`).

`SampleChannels` listens on the driver's node, opens a connection to a rollout actor on its first
direct request (a Ray call, `RolloutActor.serve`, makes the actor connect back and serve requests
until told to stop), and hands out `ChannelRef`s that `RayBackend.wait` and `get` treat like Ray's
object refs. A connection that breaks fails the requests still pending on it, as an actor's death
fails its Ray calls; an actor that died before it connected is found through its `serve` call.
"""

from __future__ import annotations

import secrets
import selectors
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import ray

from impala_trainer.rollouts.channel import STOP, TOKEN_BYTES, frame, no_delay, unframe

OPENING_POLL_SECONDS = 0.01
"""How often the serve calls of actors that have not connected yet are checked (they fail only
if the actor died first or cannot reach the listener)."""
RECV_BYTES = 1 << 20


class SampleChannelError(ray.exceptions.RayError):  # type: ignore[misc]  # ray is untyped here
    """A direct sample request failed: its actor died, raised, or the connection broke."""


class ChannelRef:
    """One direct request's result, once its reply is in (hashable by identity, like a Ray ref)."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: SampleChannelError | None = None


@dataclass(eq=False)
class _Connection:
    """A socket and its bytes in and out. The driver's sockets never block: a reply is read as
    its bytes arrive, a request written as the actor takes it, so neither side can wait on the
    other's full buffer (an actor blocked writing a reply reads no requests meanwhile)."""

    sock: socket.socket
    inbox: bytearray = field(default_factory=bytearray)
    outbox: bytearray = field(default_factory=bytearray)


@dataclass(eq=False)
class _Channel:
    handle: Any
    token: bytes
    serve_ref: Any
    conn: _Connection | None = None
    pending: deque[ChannelRef] = field(default_factory=deque)
    unsent: list[bytes] = field(default_factory=list)
    """Requests made before the actor connected, sent once it has."""
    stopping: bool = False


class SampleChannels:
    """A listener on this node and one connection per served rollout actor."""

    def __init__(self, host_ip: str, port: int = 0) -> None:
        """Listens on `port` (0: a free one; in a learner pod the pinned `LearnerPorts.samples`,
        the one the job's NetworkPolicy opens to its pods)."""
        family = socket.AF_INET6 if ":" in host_ip else socket.AF_INET
        self._listener = socket.create_server(("", port), family=family, backlog=256)
        self._listener.setblocking(False)
        self.address = (host_ip, int(self._listener.getsockname()[1]))
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._by_handle: dict[Any, _Channel] = {}
        self._opening: dict[bytes, _Channel] = {}
        """By token: channels whose actor has not connected yet."""
        self.unreachable: str | None = None
        """Why an actor could not connect to the listener (a network that lets Ray's ports
        through but not this one): then the backend makes Ray calls for the rest of the run."""

    # -- requests -------------------------------------------------------------------------------

    def sample(self, handle: Any, weights: bytes | None, version: int) -> ChannelRef:
        channel = self._by_handle.get(handle)
        if channel is None:
            channel = self._open(handle)
        ref = ChannelRef()
        channel.pending.append(ref)
        self._send(channel, frame((weights, version)))
        return ref

    def release(self, handle: Any) -> None:
        """End the actor's serve loop after the requests already sent, so that Ray calls on it
        run again (they queue behind the loop); its pending requests still complete."""
        channel = self._by_handle.pop(handle, None)
        if channel is not None:
            channel.stopping = True
            self._send(channel, frame(STOP))

    def kill(self, handle: Any) -> None:
        channel = self._by_handle.pop(handle, None)
        if channel is not None:
            self._fail(channel, "its rollout actor was stopped")

    def close(self) -> None:
        for channel in list(self._by_handle.values()):
            self._fail(channel, "the driver closed its connections")
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, _Connection):  # a connection still presenting its token
                key.data.sock.close()
        self._selector.close()
        self._listener.close()

    # -- progress -------------------------------------------------------------------------------

    def poll(self, timeout: float | None) -> None:
        """Accept connections, read what has arrived and write what the actors can take, waiting
        up to `timeout` seconds (None: until something happens) for the first."""
        if self._opening:
            self._check_opening()
            # Until they connect, their serve calls are looked at every OPENING_POLL_SECONDS.
            timeout = OPENING_POLL_SECONDS if timeout is None else timeout
            timeout = min(timeout, OPENING_POLL_SECONDS)
        for key, events in self._selector.select(timeout):
            data = key.data
            if data is None:
                self._accept()
            elif isinstance(data, _Connection):
                self._authenticate(data)
            else:
                if events & selectors.EVENT_WRITE:
                    self._flush(data)
                if events & selectors.EVENT_READ and data.conn is not None:
                    self._read(data)

    def result(self, ref: ChannelRef) -> Any:
        """The reply (waiting for it if need be), or raise SampleChannelError."""
        while not ref.done:
            self.poll(None)
        if ref.error is not None:
            raise ref.error
        return ref.value

    # -- internals ------------------------------------------------------------------------------

    def _open(self, handle: Any) -> _Channel:
        token = secrets.token_bytes(TOKEN_BYTES)
        channel = _Channel(handle, token, handle.serve.remote(self.address, token))
        self._by_handle[handle] = channel
        self._opening[token] = channel
        return channel

    def _send(self, channel: _Channel, message: bytes) -> None:
        if channel.conn is None:
            channel.unsent.append(message)
            return
        channel.conn.outbox += message
        self._flush(channel)

    def _flush(self, channel: _Channel) -> None:
        """Write what the socket takes now; wait for it to take the rest."""
        conn = channel.conn
        if conn is None:
            return
        try:
            while conn.outbox:
                sent = conn.sock.send(conn.outbox)
                del conn.outbox[:sent]
        except BlockingIOError:
            pass
        except OSError as err:
            self._fail(channel, f"sending a request failed: {err}")
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.outbox else 0)
        if self._selector.get_key(conn.sock).events != events:
            self._selector.modify(conn.sock, events, channel)

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            no_delay(sock)
            self._selector.register(sock, selectors.EVENT_READ, _Connection(sock))

    def _authenticate(self, conn: _Connection) -> None:
        """Match a new connection to its channel by the token it presents first; a connection
        without a known token is closed with nothing of it unpickled."""
        if not self._receive(conn):
            self._selector.unregister(conn.sock)
            conn.sock.close()
            return
        if len(conn.inbox) < TOKEN_BYTES:
            return  # the rest of the token is on its way
        token = bytes(conn.inbox[:TOKEN_BYTES])
        del conn.inbox[:TOKEN_BYTES]
        channel = self._opening.pop(token, None)
        if channel is None or not secrets.compare_digest(token, channel.token):
            self._selector.unregister(conn.sock)
            conn.sock.close()
            return
        channel.conn = conn
        self._selector.modify(conn.sock, selectors.EVENT_READ, channel)
        for message in channel.unsent:
            conn.outbox += message
        channel.unsent.clear()
        self._flush(channel)

    @staticmethod
    def _receive(conn: _Connection) -> bool:
        """Append what has arrived to the inbox; False once the connection has ended."""
        try:
            data = conn.sock.recv(RECV_BYTES)
        except BlockingIOError:
            return True
        except OSError:
            return False
        conn.inbox += data
        return bool(data)

    def _read(self, channel: _Channel) -> None:
        conn = channel.conn
        assert conn is not None
        open_ = self._receive(conn)
        for status, payload in unframe(conn.inbox):
            if not channel.pending:
                self._fail(channel, "a reply nobody asked for")
                return
            ref = channel.pending.popleft()
            ref.done = True
            if status == "ok":
                ref.value = payload
            else:
                ref.error = SampleChannelError(f"the rollout actor raised:\n{payload}")
                self._fail(channel, "its sample raised")
                return
        if not open_:
            if channel.pending or not channel.stopping:
                self._fail(channel, "its connection closed")
            else:
                self._close(channel)  # a released actor left its loop, as asked

    def _check_opening(self) -> None:
        """Fail the channels whose serve call ended before their actor connected."""
        refs = {channel.serve_ref: channel for channel in self._opening.values()}
        ended, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ended:
            channel = refs[ref]
            try:
                ray.get(ref)
                reason = "its actor's serve call ended before it connected"
            except ray.exceptions.RayTaskError as err:  # the actor lives: it could not connect
                reason = f"its actor could not connect to {self.address}: {err}"
                self.unreachable = reason
            except ray.exceptions.RayError as err:
                reason = f"its actor failed before it connected: {err}"
            self._fail(channel, reason)

    def _fail(self, channel: _Channel, reason: str) -> None:
        for ref in channel.pending:
            ref.done = True
            ref.error = SampleChannelError(f"direct sample request failed: {reason}")
        channel.pending.clear()
        channel.unsent.clear()
        self._close(channel)

    def _close(self, channel: _Channel) -> None:
        self._opening.pop(channel.token, None)
        if self._by_handle.get(channel.handle) is channel:
            del self._by_handle[channel.handle]
        if channel.conn is not None:
            self._selector.unregister(channel.conn.sock)
            channel.conn.sock.close()
            channel.conn = None


def wait_mixed(
    channels: SampleChannels, refs: list[Any], num_returns: int, timeout: float
) -> tuple[list[Any], list[Any]]:
    """`ray.wait` over Ray refs and ChannelRefs together: blocks on the connections, and wakes
    every OPENING_POLL_SECONDS to look at the Ray refs only while there are any."""
    deadline = time.monotonic() + timeout
    others = [r for r in refs if not isinstance(r, ChannelRef)]
    while True:
        channels.poll(0)
        ready = [r for r in refs if isinstance(r, ChannelRef) and r.done]
        if others and len(ready) < num_returns:
            want = min(len(others), num_returns - len(ready))
            ready += ray.wait(others, num_returns=want, timeout=0)[0]
        remaining = deadline - time.monotonic()
        if len(ready) >= num_returns or remaining <= 0:
            break
        channels.poll(min(remaining, OPENING_POLL_SECONDS) if others else remaining)
    ready = ready[:num_returns]
    chosen = {id(r) for r in ready}
    return ready, [r for r in refs if id(r) not in chosen]
