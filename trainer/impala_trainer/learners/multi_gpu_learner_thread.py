"""RLlib's MultiGPULearnerThread: loader threads fill idle tower stacks, the learner trains on
ready ones.

Flow, for D devices and S tower stacks (S batch slots on every device):

    inqueue --loader threads--> learner.load_batch_into_buffer(batch, idle stack) --> ready
    ready --MinibatchBuffer (numSgdIter passes)--> learner.learn_on_loaded_batch(stack)
          --last pass--> idle

Copies to the devices overlap training whenever S > 1; each loaded stack is trained on
numSgdIter times without being copied again.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING

from impala_trainer.learners.learner_thread import (
    POLL_SECONDS,
    BatchQueue,
    LearnerThread,
    sampled_version,
)
from impala_trainer.learners.minibatch_buffer import MinibatchBuffer

if TYPE_CHECKING:
    from impala_trainer.learning.towers import MultiDeviceLearner

logger = logging.getLogger(__name__)


class MultiGPULearnerThread(LearnerThread):
    """Learner thread for a MultiDeviceLearner, with `num_gpu_loader_threads` loaders."""

    def __init__(
        self,
        learner: MultiDeviceLearner,
        num_sgd_iter: int = 1,
        learner_queue_size: int = 16,
        learner_queue_timeout: float = 300.0,
        num_multi_gpu_tower_stacks: int = 1,
        num_gpu_loader_threads: int = 8,
        intra_op_threads: int | None = None,
        inqueue: BatchQueue | None = None,
    ) -> None:
        super().__init__(
            learner,
            minibatch_buffer_size=1,
            num_sgd_iter=num_sgd_iter,
            learner_queue_size=learner_queue_size,
            learner_queue_timeout=learner_queue_timeout,
            intra_op_threads=intra_op_threads,
            inqueue=inqueue,
        )
        if num_multi_gpu_tower_stacks > learner.num_stacks:
            raise ValueError(
                f"{num_multi_gpu_tower_stacks} tower stacks requested but the learner has "
                f"{learner.num_stacks} buffer slots (numMultiGpuTowerStacks)"
            )
        self.learner: MultiDeviceLearner = learner
        self.idle_tower_stacks: queue.Queue[int] = queue.Queue()
        self.ready_tower_stacks: queue.Queue[int] = queue.Queue()
        for index in range(num_multi_gpu_tower_stacks):
            self.idle_tower_stacks.put(index)
        # Per loaded stack, the version that sampled its batch, for the policy lag at the
        # stack's first pass.
        self._sampled_version: dict[int, float] = {}
        # One slot per stack, as RLlib: passes over different stacks interleave.
        self.ready_tower_stacks_buffer: MinibatchBuffer[int] = MinibatchBuffer(
            self.ready_tower_stacks, num_multi_gpu_tower_stacks, learner_queue_timeout, num_sgd_iter
        )
        self.loader_threads = [
            threading.Thread(target=self._load_loop, name=f"loader-{i}", daemon=True)
            for i in range(num_gpu_loader_threads)
        ]

    def start(self) -> None:
        for loader in self.loader_threads:
            loader.start()
        super().start()

    def step(self) -> None:
        """Wait for a ready stack, learn on it, free it after its last pass, report."""
        got = self._wait_for(self.ready_tower_stacks_buffer)
        index = got.item
        start = time.perf_counter()
        lag = None
        if got.first_pass:
            lag = self.learner.policy_version - self._sampled_version.pop(index)
        stats = self.learner.learn_on_loaded_batch(index)
        # Read before releasing: once idle, a loader may overwrite the stack.
        env_steps = self.learner.get_num_samples_loaded_into_buffer(index) if got.first_pass else 0
        if got.released:
            self.idle_tower_stacks.put(index)
        self._record_update(start, env_steps, stats, lag)

    def _load_loop(self) -> None:
        try:
            while not self.stopped:
                try:
                    batch = self.inqueue.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    continue
                wait_start = time.perf_counter()
                index = self._idle_stack()
                if index is None:
                    return
                self.load_wait_timer.push(time.perf_counter() - wait_start)
                with self.load_timer.timing():
                    self.learner.load_batch_into_buffer(batch, index)
                self._sampled_version[index] = sampled_version(batch)
                self.ready_tower_stacks.put(index)
        except BaseException as exc:  # a dead loader would starve the learner: fail loudly
            if self.error is None:
                self.error = exc
            logger.error("learner loader thread failed: %s", exc, exc_info=True)
            self.stop()

    def _idle_stack(self) -> int | None:
        while not self.stopped:
            try:
                return self.idle_tower_stacks.get(timeout=POLL_SECONDS)
            except queue.Empty:
                continue
        return None
