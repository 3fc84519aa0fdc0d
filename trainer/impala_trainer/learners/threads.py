"""Which learner thread a job gets, with its learner built and the intra-op threads handed over.

Apart from both thread modules so that neither imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from impala_trainer.learners.learner_thread import BatchQueue, LearnerThread
from impala_trainer.learners.multi_gpu_learner_thread import MultiGPULearnerThread
from impala_trainer.learning.distributions import ActionDistribution

if TYPE_CHECKING:  # torch, which the learner module imports
    from impala_trainer.learning.learner import LearnerConfig

_process_threads: int | None = None
"""The process's intra-op thread count before the first learner thread took it from main."""


def _take_intra_op_threads() -> int:
    """The intra-op threads for a new learner thread; leaves the calling thread with one.

    After the first call the calling thread reports 1, so the count it had is kept here (a later
    learner in the same process, e.g. the next case of bench/learner_only.py, gets the same);
    a count set again since (anything but 1) wins.
    """
    import torch

    global _process_threads
    current = torch.get_num_threads()
    if _process_threads is None or current != 1:
        _process_threads = current
    torch.set_num_threads(1)
    return _process_threads


def uses_multi_gpu_thread(config: LearnerConfig) -> bool:
    """Several devices (gpus > 1 or fakeDevices > 0), or one GPU with several tower stacks."""
    gpus = config.learner.gpus
    return (
        gpus > 1
        or config.learner.fake_devices > 0
        or (gpus == 1 and config.training.num_multi_gpu_tower_stacks > 1)
    )


def batches_held_by_learner(config: LearnerConfig) -> int:
    """How many batches the learner thread may hold out of its inqueue at once: the minibatch
    buffer's, or one per loader thread waiting for an idle tower stack and one per stack (a CPU
    tower's buffer may be a view of the batch it loaded)."""
    t = config.training
    if uses_multi_gpu_thread(config):
        return t.num_gpu_loader_threads + t.num_multi_gpu_tower_stacks
    return t.minibatch_buffer_size


def make_learner_thread(
    config: LearnerConfig,
    obs_shape: tuple[int, ...],
    actions: ActionDistribution | int,
    inqueue: BatchQueue | None = None,
) -> LearnerThread | MultiGPULearnerThread:
    """The learner (built here) inside the thread the config asks for (`.learner` holds it).

    Several devices (gpus > 1 or fakeDevices > 0), or one GPU with several tower stacks, use the
    MultiGPULearnerThread with loader threads; otherwise the plain LearnerThread.
    """
    from impala_trainer.learning.learner import Learner
    from impala_trainer.learning.towers import MultiDeviceLearner

    # The learner thread computes with the process's intra-op threads; the calling (main) thread
    # drops to one before it runs any parallel op (the model's init included). Once the initial
    # thread owns an OpenMP team, libgomp makes every parallel op another thread starts ~80 us
    # slower (measured, torch 2.15): a CartPole update in the learner thread took 6-7 ms with 2
    # threads against 2.6-3 ms with the main thread kept single-threaded. The main thread only
    # copies weights out and writes checkpoints.
    threads = _take_intra_op_threads()

    t, gpus = config.training, config.learner.gpus
    if uses_multi_gpu_thread(config):
        return MultiGPULearnerThread(
            MultiDeviceLearner(config, obs_shape, actions),
            num_sgd_iter=t.num_sgd_iter,
            learner_queue_size=t.learner_queue_size,
            learner_queue_timeout=t.learner_queue_timeout,
            num_multi_gpu_tower_stacks=t.num_multi_gpu_tower_stacks,
            num_gpu_loader_threads=t.num_gpu_loader_threads,
            intra_op_threads=threads,
            inqueue=inqueue,
        )
    device = "cuda:0" if gpus == 1 else "cpu"
    return LearnerThread(
        Learner(config, obs_shape, actions, device=device),
        minibatch_buffer_size=t.minibatch_buffer_size,
        num_sgd_iter=t.num_sgd_iter,
        learner_queue_size=t.learner_queue_size,
        learner_queue_timeout=t.learner_queue_timeout,
        intra_op_threads=threads,
        inqueue=inqueue,
    )
