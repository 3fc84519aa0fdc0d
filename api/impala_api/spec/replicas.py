"""Where the job runs: the learner pod, and the rollout and aggregator pod groups with their
autoscaling."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from impala_api.spec.base import SpecModel
from impala_api.spec.pods import PodOverrides, Resources, Toleration

REPLICAS_NEED_VTRACE = (
    "spec.learner.replicas above 1 trains one set of weights on several learners that average "
    "their gradients before each step, and spec.training.mode async-gradients has no learner "
    "(the driver applies each worker's gradients as they come): use replicas 1, or mode vtrace"
)
SEPARATE_LEARNER_NEEDS_VTRACE = (
    "spec.learner.process separate runs the learner thread in a process of its own, and "
    "spec.training.mode async-gradients has no learner thread (the driver applies the workers' "
    "gradients): use process driver, or mode vtrace"
)


class LearnerSpec(SpecModel):
    """The learner pod: Ray head, IMPALA driver and learner threads."""

    gpus: int = Field(default=0, ge=0, le=16)
    """GPUs for the learner; more than one uses the multi-device learner (one tower per GPU).
    With replicas, each learner has these GPUs."""

    replicas: int = Field(default=1, ge=1, le=64)
    """Learners that train one set of weights in lock step (data parallel, as PyTorch's
    DistributedDataParallel: the same initial weights, and every learner's gradients averaged
    over all of them, gloo on CPU and NCCL on CUDA, before each optimiser step). Each learner
    trains its own stream of batches of trainBatchSize, so an update learns from replicas x
    trainBatchSize env steps (RLlib's train_batch_size_per_learner). The loss is summed over a
    batch's steps, so the averaged gradient is 1/replicas of what one learner would get from
    the whole replicas x trainBatchSize batch: the same step for Adam and RMSprop up to their
    epsilon, while gradClip applies to the averaged gradient. Above 1, every learner is a
    process of its own (learner.process does not apply); learner 0 runs beside the driver and
    its weights are the ones broadcast to the rollouts and checkpointed. V-trace mode only.
    impalajob train runs every learner on its embedded Ray; on a cluster each learner is a pod
    with the learner's resources (rank 0 the Ray head and driver, ranks 1..N-1 join it), started
    together and, when one is lost, restarted together from the newest checkpoint.

    What it does to learning: N learners take one optimiser step per N x trainBatchSize env
    steps, so a run makes 1/N of one learner's updates per env step, each on a less noisy
    gradient but with the same learning rate. A run tuned for one learner then learns less
    per env step (more per second only where the learners, not the rollouts, were the limit).
    lrScaling is the usual remedy."""

    lr_scaling: Literal["none", "sqrt", "linear"] = "none"
    """How the learning rate (lr, lrVf and every point of lrSchedule) follows replicas: none
    keeps it; sqrt multiplies it by sqrt(replicas), as RLlib's tuned multi-learner examples do
    for Adam (the gradient's noise falls by that factor); linear by replicas (Goyal et al.'s
    rule for SGD with momentum, often too much for Adam). The learner's cur_lr is the scaled
    rate. With replicas 1 every choice is the same."""

    @property
    def lr_factor(self) -> float:
        """What lrScaling multiplies the learning rate by."""
        if self.lr_scaling == "sqrt":
            return math.sqrt(self.replicas)
        return float(self.replicas) if self.lr_scaling == "linear" else 1.0

    termination_grace_period_seconds: int = Field(default=120, ge=1, le=86_400)
    """SIGTERM to SIGKILL for the learner pod: time to write the final checkpoint (a large
    model on a slow volume needs more)."""

    fake_devices: int = Field(default=0, ge=0, le=16)
    """With gpus 0: run the multi-device learner on this many CPU towers (like _fake_gpus)."""

    precision: Literal["float32", "bfloat16", "auto"] = "float32"
    """The learner's forward and backward: float32, or bfloat16 mixed precision (autocast: the
    convolutions and matrix products in bfloat16; weights, gradients, optimiser, V-trace and
    loss in float32). auto takes bfloat16 where the learner's device computes it natively (a GPU
    with bf16, a CPU with AVX512-BF16 or AMX) and float32 elsewhere, where bf16 is emulated and
    slower. With bfloat16 or auto, rollout workers whose CPU computes bf16 natively act with a
    bf16 copy of the built-in CNN and ResNet models (the learner's arithmetic)."""

    process: Literal["driver", "separate"] = "driver"
    """Where the learner thread runs: in the driver's process (driver), or in a process of its
    own (separate), so that its updates and the driver loop's Ray calls do not take turns on one
    Python interpreter lock: for small models (hundreds of small ops per update) where the
    learner pod has a core for each. A batch's large arrays reach the process through shared
    memory; the process forks from a server that imports torch while Ray starts. V-trace mode
    only."""

    resources: Resources = Field(default_factory=Resources)
    """Learner container resources (GPU requests are added from gpus). The CPU request (else
    limit) is also the learner's intra-op thread count, rounded down (1 without either;
    OMP_NUM_THREADS in pod.env overrides it)."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector for the learner pod."""

    tolerations: list[Toleration] = Field(default_factory=list)
    """Tolerations for the learner pod."""

    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Settings merged onto the learner pod (env, volumes, pull secrets, affinity, priority...)."""


class AutoscalingSpec(SpecModel):
    """How the operator moves replicas between min and max from the learner's metrics."""

    enabled: bool = True
    """Scale between minReplicas and maxReplicas automatically."""

    scale_up_step: int = Field(default=1, ge=1, le=100)
    """Most replicas added by one decision."""

    scale_down_step: int = Field(default=1, ge=1, le=100)
    """Most replicas removed by one decision."""

    cooldown_seconds: int = Field(default=60, ge=0, le=86_400)
    """Minimum seconds between two scaling decisions."""

    stabilization_window_seconds: int = Field(default=120, ge=0, le=86_400)
    """Metrics window a decision must hold over (no flapping on noisy input)."""

    starved_queue_fill: float = Field(default=0.1, ge=0.0, le=1.0)
    """Learner queue fill at or below which (with the learner waiting) rollouts scale up."""

    saturated_queue_fill: float = Field(default=0.9, ge=0.0, le=1.0)
    """Learner queue fill at or above which rollouts scale down."""

    @model_validator(mode="after")
    def _thresholds(self) -> AutoscalingSpec:
        if self.starved_queue_fill >= self.saturated_queue_fill:
            raise ValueError("starvedQueueFill must be below saturatedQueueFill")
        return self


class ReplicaGroupSpec(SpecModel):
    """A group of pods that join the learner's Ray cluster."""

    replicas: int | None = Field(default=None, ge=0, le=1000)
    """Desired pods (kubectl scale sets it); kept within [minReplicas, maxReplicas]."""

    min_replicas: int = Field(default=1, ge=0, le=1000)
    """Fewest pods."""

    max_replicas: int = Field(default=4, ge=0, le=1000)
    """Most pods."""

    resources: Resources = Field(default_factory=Resources)
    """Container resources of each pod."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node selector for these pods."""

    tolerations: list[Toleration] = Field(default_factory=list)
    """Tolerations for these pods."""

    pod: PodOverrides = Field(default_factory=PodOverrides)
    """Settings merged onto these pods (env, volumes, pull secrets, affinity, priority...)."""

    termination_grace_period_seconds: int = Field(default=60, ge=1, le=86_400)
    """SIGTERM to SIGKILL for these pods: the node drains on SIGTERM, finishing and handing over
    its in-flight fragment (a slow environment step needs more)."""

    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    """Autoscaling policy."""

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaGroupSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) must be <= maxReplicas ({self.max_replicas})"
            )
        return self

    @property
    def initial_replicas(self) -> int:
        """Replicas to start with: the requested count clamped into [min, max]."""
        wanted = self.min_replicas if self.replicas is None else self.replicas
        return max(self.min_replicas, min(self.max_replicas, wanted))


class RolloutsSpec(ReplicaGroupSpec):
    """Rollout pods: each runs workersPerPod rollout workers."""

    min_replicas: int = Field(default=2, ge=0, le=1000)
    """Fewest rollout pods."""

    max_replicas: int = Field(default=4, ge=0, le=1000)
    """Most rollout pods."""

    workers_per_pod: int = Field(default=1, ge=1, le=256)
    """Rollout workers (Ray actors) per pod; locally, workers per simulated pod."""

    transport: Literal["auto", "ray"] = "auto"
    """How sample requests and their fragments travel between the driver and the rollout
    workers. auto: over a TCP connection of their own from each worker to the learner pod (any
    port between the job's pods, which its NetworkPolicy allows) where they are small (weights
    up to 64 KiB, fragments up to 1 MiB: a CartPole-sized MLP, not Atari frames) and no
    aggregator pod takes the fragments; as Ray actor calls otherwise. ray: always as Ray actor
    calls, each ~0.8 ms of CPU more than over the connection (on a 2-core machine)."""


class AggregatorsSpec(ReplicaGroupSpec):
    """Aggregator pods: concatenate fragments into train batches and mix in replay."""

    min_replicas: int = Field(default=0, ge=0, le=1000)
    """Fewest aggregator pods (0: the driver aggregates)."""

    max_replicas: int = Field(default=0, ge=0, le=1000)
    """Most aggregator pods."""
