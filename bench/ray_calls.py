"""What one sample request costs in Ray itself: actor calls, Ray Compiled Graphs, a socket.

Two actors each answer a request with ~0.8 ms of work and a CartPole-sized fragment (136 x 4
float32 observations, 128 actions and rewards), given ~16 KiB of inline weights, as the
CartPole example's rollout actors do. The driver keeps one request in flight per actor:
- `calls`: `actor.sample.remote(weights)`, `ray.wait` for either, `ray.get`, ask again (the
  driver loop's path);
- `compiled`: one Compiled Graph per actor (`actor.sample.bind(InputNode())`,
  `experimental_compile()`), `execute` and `get` in turn (a compiled ref cannot be waited on
  with `ray.wait`);
- `socket`: what a data channel of our own beside Ray would cost. Each actor connects to a
  listener of the driver (`multiprocessing.connection`, TCP, as a rollout pod would reach the
  learner pod) and then serves requests on it until told to stop; the driver waits on both
  connections (`connection.wait`, blocking, no polling), reads a fragment, sends the next request.
  Ray only places and starts the actors.
Reported: requests/s, and CPU per request over this process and every process Ray started for
it (both actors, the raylet, the GCS; psutil), so the cost of the transport is CPU per request
minus the work.

    python bench/ray_calls.py                  # 2 alternating rounds of 10 s each
    python bench/ray_calls.py --seconds 5 --rounds 1
"""

from __future__ import annotations

import argparse
import secrets
import socket as sockets
import time
from multiprocessing.connection import Client, Connection, Listener, wait
from typing import Any

import numpy as np
import psutil
import ray

from common import machine_line, quiet_ray_logs, table

WORK_SECONDS = 0.0008


@ray.remote
class Sampler:
    def __init__(self) -> None:
        self.state = np.random.default_rng(0).random((64, 64))

    def sample(self, weights: bytes) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        while time.perf_counter() - start < WORK_SECONDS:  # stands in for 128 env steps
            self.state = self.state @ self.state * 1e-3
        return {
            "obs": np.zeros((136, 4), np.float32),
            "actions": np.zeros(128, np.int64),
            "rewards": np.zeros(128, np.float32),
        }

    def serve(self, address: tuple[str, int], authkey: bytes) -> int:
        """Answer requests on a connection to the driver until it sends None; -> requests served."""
        n = 0
        with Client(address, authkey=authkey) as conn:
            _no_delay(conn)
            while (weights := conn.recv()) is not None:
                conn.send(self.sample(weights))
                n += 1
        return n


def _no_delay(conn: Connection) -> None:
    """TCP_NODELAY: a message is a header and a body, two sends, and Nagle's algorithm holds the
    second until the first is acknowledged, which a delayed ACK takes ~40 ms to do."""
    with sockets.fromfd(conn.fileno(), sockets.AF_INET, sockets.SOCK_STREAM) as s:
        s.setsockopt(sockets.IPPROTO_TCP, sockets.TCP_NODELAY, 1)


def _cpu_seconds() -> float:
    """User + system CPU of this process and its descendants (ray.init started them all)."""
    me = psutil.Process()
    return sum(sum(p.cpu_times()[:2]) for p in [me, *me.children(recursive=True)])


def calls(actors: list[Any], weights: bytes, seconds: float) -> int:
    pending = {a.sample.remote(weights): a for a in actors}
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        ready, _ = ray.wait(list(pending), num_returns=1)
        actor = pending.pop(ready[0])
        ray.get(ready[0])
        n += 1
        pending[actor.sample.remote(weights)] = actor
    ray.get(list(pending))
    return n


def compiled(actors: list[Any], weights: bytes, seconds: float) -> int:
    from ray.dag import InputNode

    graphs = []
    for actor in actors:
        with InputNode() as inp:
            node = actor.sample.bind(inp)
        graphs.append(node.experimental_compile())
    refs = [g.execute(weights) for g in graphs]
    n, i = 0, 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        refs[i].get()
        n += 1
        refs[i] = graphs[i].execute(weights)
        i = (i + 1) % len(graphs)
    for ref in refs:
        ref.get()
    for g in graphs:
        g.teardown()
    return n


def socket(actors: list[Any], weights: bytes, seconds: float) -> int:
    authkey = secrets.token_bytes(16)
    with Listener(("127.0.0.1", 0), authkey=authkey) as listener:
        served = [a.serve.remote(listener.address, authkey) for a in actors]
        conns: list[Connection] = [listener.accept() for _ in actors]
        for conn in conns:
            _no_delay(conn)
            conn.send(weights)
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for conn in wait(conns):
                conn.recv()  # type: ignore[union-attr]
                n += 1
                conn.send(weights)  # type: ignore[union-attr]
        for conn in conns:
            conn.recv()
            conn.send(None)
        ray.get(served)
        for conn in conns:
            conn.close()
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    quiet_ray_logs()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    actors = [Sampler.remote() for _ in range(2)]  # type: ignore[attr-defined]
    weights = bytes(16 * 1024)
    rows = []
    for r in range(args.rounds):
        for name, loop in (("calls", calls), ("compiled", compiled), ("socket", socket)):
            cpu, start = _cpu_seconds(), time.perf_counter()
            n = loop(actors, weights, args.seconds)
            elapsed, used = time.perf_counter() - start, _cpu_seconds() - cpu
            rows.append([r + 1, name, f"{n / elapsed:,.0f}", f"{1e3 * used / n:.2f}"])
    print(table(["round", "transport", "requests/s", "CPU ms per request"], rows))
    print(f"work per request: {1e3 * WORK_SECONDS:.1f} ms; {machine_line()}")
    ray.shutdown()


if __name__ == "__main__":
    main()
