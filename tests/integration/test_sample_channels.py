"""Direct sample connections between the driver and real rollout actors on an embedded Ray
(`driver/channels.py`, `rollouts/channel.py`): what `RayBackend` hands the driver loop must
behave as Ray's own calls do, in results, order, failures and the calls that follow."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.net import free_port
from impala_api.manifest import load_manifest
from impala_api.spec import DEFAULT_POLICY
from impala_trainer.rollouts import channel

pytestmark = pytest.mark.slow

EXAMPLE = "manifests/examples/cartpole.yaml"


@pytest.fixture(scope="module")
def backend() -> Iterator[Any]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    import ray

    from impala_trainer.driver.ray_backend import RayBackend

    ray.init(
        address="local", num_cpus=2, resources={"rollout": 4, "aggregator": 0},
        include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
    )  # fmt: skip
    yield RayBackend()
    ray.shutdown()


def _actor(backend: Any, name: str, seed: int = 0) -> Any:
    spec = load_manifest(EXAMPLE).spec
    handle = backend.start("rollout", spec, name, seed)
    backend.get(backend.node_info(handle))  # built
    return handle


def _weights(version: int) -> bytes:
    """The example's weights as the driver sends them inline (pickled once per broadcast)."""
    from impala_trainer.learners.policies import PolicySetState
    from impala_trainer.learning.learner import Learner, LearnerConfig

    learner = Learner(LearnerConfig.of(load_manifest(EXAMPLE).spec), (4,), 2)
    learner.policy_version = version
    return PolicySetState({DEFAULT_POLICY: learner}).pickled_weights()


def test_direct_requests_answer_in_order_and_the_counts_match_ray_calls(backend: Any) -> None:
    handle = _actor(backend, "ordered")
    weights = _weights(7)
    # Two in flight, the first with weights: replies in order, each 8 envs x 16 steps.
    refs = [
        backend.sample_whole(handle, weights, 7, direct=True),
        backend.sample_whole(handle, None, 7, direct=True),
    ]
    ready, rest = backend.wait(refs, num_returns=2, timeout=60)
    assert len(ready) == 2 and not rest
    metas = [backend.get(ref)[1] for ref in refs]
    assert [m.env_steps for m in metas] == [128, 128]
    assert [m.policy_version for m in metas] == [7, 7]  # the sent weights were loaded
    fragment, _ = backend.get(refs[1])
    assert fragment.obs.shape == (16, 8, 4)
    # Ray calls on the same actor after direct ones (they end its serve loop first): a Ray
    # sample and its handover see every step the direct requests took.
    _, meta_ref = backend.sample(handle, None, 7)
    assert backend.get(meta_ref).env_steps == 128
    assert backend.get(backend.handover(handle)).env_steps == 3 * 128
    # And direct again: a new connection.
    assert backend.get(backend.sample_whole(handle, None, 7, direct=True))[1].env_steps == 128
    backend.kill(handle)


def test_wait_mixes_direct_and_ray_refs(backend: Any) -> None:
    a, b = _actor(backend, "mixed-a"), _actor(backend, "mixed-b", seed=1)
    direct = backend.sample_whole(a, None, 0, direct=True)
    by_ray = backend.sample_whole(b, None, 0)
    ready, rest = backend.wait([direct, by_ray], num_returns=2, timeout=60)
    assert {id(r) for r in ready} == {id(direct), id(by_ray)} and not rest
    assert [m.env_steps for _, m in backend.get_many([direct, by_ray])] == [128, 128]
    backend.kill(a)
    backend.kill(b)


def test_an_actor_that_dies_fails_its_pending_direct_requests(backend: Any) -> None:
    import ray

    handle = _actor(backend, "doomed")
    backend.get(backend.sample_whole(handle, None, 0, direct=True))  # connected
    process = psutil.Process(ray._private.state.actors(actor_id=handle._actor_id.hex())["Pid"])
    ray.kill(handle, no_restart=True)  # as an OOM kill would: not through the backend
    process.wait(timeout=60)  # Ray says DEAD before the process has exited
    # The driver does not know yet: it asks the dead actor, over the connection it had.
    pending = [backend.sample_whole(handle, None, 0, direct=True) for _ in range(2)]
    ready, _ = backend.wait(pending, num_returns=2, timeout=60)
    assert len(ready) == 2, "a dead actor's direct requests must come back, failed"
    for ref in pending:
        with pytest.raises(backend.failure):
            backend.get(ref)


def test_a_request_that_raises_in_the_actor_fails_with_its_traceback(backend: Any) -> None:
    handle = _actor(backend, "raises")
    broken = backend.sample_whole(handle, b"not a pickle", 1, direct=True)
    after = backend.sample_whole(handle, None, 1, direct=True)  # behind it on the connection
    ready, _ = backend.wait([broken, after], num_returns=2, timeout=60)
    assert len(ready) == 2
    with pytest.raises(backend.failure, match=r"(?s)the rollout actor raised.*Unpickling"):
        backend.get(broken)
    with pytest.raises(backend.failure):  # its loop ended: the driver replaces the actor
        backend.get(after)
    backend.kill(handle)


def test_an_actor_that_dies_before_it_connects_fails_its_requests(backend: Any) -> None:
    import ray

    handle = _actor(backend, "never-connects")
    process = psutil.Process(ray._private.state.actors(actor_id=handle._actor_id.hex())["Pid"])
    ray.kill(handle, no_restart=True)
    process.wait(timeout=60)
    ref = backend.sample_whole(handle, None, 0, direct=True)  # its serve call cannot run
    ready, _ = backend.wait([ref], num_returns=1, timeout=60)
    assert ready == [ref]
    with pytest.raises(backend.failure, match="before it connected"):
        backend.get(ref)


def test_a_connection_without_the_token_is_closed_unread(backend: Any, tmp_path: Path) -> None:
    handle = _actor(backend, "guarded")
    ref = backend.sample_whole(handle, None, 0, direct=True)
    backend.get(ref)
    channels = backend._channels
    marker = tmp_path / "unpickled"

    class Payload:  # what the driver would run if it unpickled a stranger's bytes
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    with socket.create_connection(channels.address, timeout=10) as stranger:
        stranger.sendall(b"x" * channel.TOKEN_BYTES)
        body = pickle.dumps(("ok", Payload()))
        stranger.sendall(len(body).to_bytes(8, "big") + body)
        # The driver reads the token as it polls (any wait does), and closes the connection.
        deadline = time.monotonic() + 10
        closed = False
        while not closed and time.monotonic() < deadline:
            backend.wait([backend.sample_whole(handle, None, 0, direct=True)], 1, 1.0)
            stranger.settimeout(0.1)
            try:
                closed = stranger.recv(1) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed = True
        assert closed
    assert not marker.exists()
    backend.kill(handle)


def test_actors_that_cannot_reach_the_driver_sample_by_ray_calls_instead(backend: Any) -> None:
    from impala_trainer.driver.channels import SampleChannels

    saved = backend._channels
    channels = backend._channels = SampleChannels("127.0.0.1")
    try:
        channels.address = ("127.0.0.1", free_port())  # nothing listens there: refused
        handle = _actor(backend, "cut-off")
        ref = backend.sample_whole(handle, None, 0, direct=True)
        backend.wait([ref], num_returns=1, timeout=60)
        with pytest.raises(backend.failure, match="could not connect"):
            backend.get(ref)  # the driver replaces this actor, as for any failed request
        assert channels.unreachable is not None
        # From then on the same request goes as a Ray call, and is answered.
        _, meta = backend.get(backend.sample_whole(handle, None, 0, direct=True))
        assert meta.env_steps == 128
        backend.kill(handle)
    finally:
        channels.close()
        backend._channels = saved
