"""The ImpalaJob manifest as one pydantic model: the single source of truth.

The same model validates a manifest for `impalajob train -f`, is used by the operator, and
generates the CRD's openAPIV3Schema. Keep it free of torch/ray imports: the operator image path and
the CRD generator import it.

Training fields use RLlib's IMPALAConfig names in camelCase, with RLlib's IMPALA defaults except
the few in DEFAULTS_APART_FROM_RLLIB; names whose meaning differs from RLlib's are not used
(RENAMED_RLLIB).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

API_GROUP = "impala.dev"
API_VERSION = "v1alpha1"
KIND = "ImpalaJob"
PLURAL = "impalajobs"

# Children are named "<job>-learner", "<job>-rollout", "<job>-aggregator", "<job>-status": keeping
# the job name at most 40 characters leaves room under the 63-character label/DNS limit.
MAX_NAME_LENGTH = 40
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


RENAMED_RLLIB: dict[str, str] = {
    "replayProportion": (
        "RLlib's replay_proportion is not taken under its name, because RLlib's mixin buffer "
        "turns p into 1/(p-1) replayed fragments per new one (none for p < 1, only replays for "
        "p = 1); set replayBatchesPerFresh, the replayed train batches per fresh one (RLlib's "
        "p > 1 is replayBatchesPerFresh 1/(p-1))"
    ),
    "replayBufferNumSlots": (
        "RLlib's replay_buffer_num_slots counts worker samples; set replayBufferBatches, the "
        "replay capacity in train batches"
    ),
}
"""RLlib IMPALAConfig names whose meaning differs here, with the field to use instead: a user
must never get silently different behaviour under an RLlib name."""


DEFAULTS_APART_FROM_RLLIB: dict[str, tuple[object, str]] = {
    "env.numEnvsPerWorker": (
        1,
        "16: one batched forward for all of a worker's envs is where rollout speed comes from "
        "(docs/benchmarks.md, 1a); RLlib's num_envs_per_env_runner is 1",
    ),
    "training.learnerQueueSize": (
        3,
        "16, the default of RLlib's old stack, whose LearnerThread this mirrors (RLlib now says "
        "3); the queue never drops a batch here, it holds back the actors, so its size bounds "
        "memory and policy lag only",
    ),
    "training.maxRequestsInFlightPerWorker": (
        1,
        "2, the old stack's max_requests_in_flight_per_sampler_worker: a worker samples its next "
        "fragment while the last one is in transit (RLlib now says 1 per env runner)",
    ),
}
"""Defaults that differ from RLlib's IMPALAConfig (field -> (RLlib's default, why ours)).
tests/unit/trainer/test_spec.py compares every default with RLlib's."""


class SpecModel(BaseModel):
    """Base for every manifest section: camelCase on the wire, unknown fields rejected."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
        validate_assignment=True,
    )


# A schedule's points are bounded so the CRD's CEL rule on their order stays within the API
# server's cost budget (an unbounded list is estimated at megabytes of points).
MAX_SCHEDULE_POINTS = 1000
Schedule = Annotated[
    list[tuple[Annotated[int, Field(ge=0)], float]], Field(max_length=MAX_SCHEDULE_POINTS)
]


def _check_schedule(value: Schedule | None, field: str) -> Schedule | None:
    if value is None:
        return value
    if not value:
        raise ValueError(f"{field} must list at least one [timestep, value] point, or be omitted")
    steps = [step for step, _ in value]
    if steps != sorted(steps) or len(set(steps)) != len(steps):
        raise ValueError(
            f"{field} timesteps must strictly increase, got {steps}; "
            "write points as [[0, start], [N, end], ...]"
        )
    return value


class EnvSpec(SpecModel):
    """The environment every rollout worker steps."""

    id: str = Field(default="CartPole-v1", min_length=1)
    """Gymnasium environment id, e.g. CartPole-v1 or ALE/Pong-v5 (Atari ROMs ship in ale-py)."""

    num_envs_per_worker: int = Field(default=16, ge=1, le=4096)
    """Environments each rollout worker steps as one vector env with batched inference (RLlib's
    default is 1: DEFAULTS_APART_FROM_RLLIB says why not here)."""

    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to gymnasium.make."""

    frame_stack: int | None = Field(default=None, ge=1, le=16)
    """Frames stacked per observation (Atari; defaults to 4 for ALE/ environments)."""

    frame_skip: int = Field(default=4, ge=1, le=16)
    """Atari frame skip applied by the preprocessing wrapper."""

    clip_rewards: bool | None = None
    """Train on the sign of each reward (-1, 0, 1), as the paper and RLlib do for Atari; the
    reported episode returns stay unclipped. Default: on for ALE/ environments, off otherwise."""

    @property
    def is_atari(self) -> bool:
        return self.id.startswith("ALE/")

    @property
    def clips_rewards(self) -> bool:
        return self.is_atari if self.clip_rewards is None else self.clip_rewards

    @property
    def stacked_frames(self) -> int:
        if self.frame_stack is not None:
            return self.frame_stack
        return 4 if self.is_atari else 1


class ModelSpec(SpecModel):
    """The policy/value network."""

    type: Literal["auto", "mlp", "cnn"] = "auto"
    """mlp for vector observations, cnn (IMPALA shallow CNN) for 84x84 frames; auto picks."""

    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [256, 256], min_length=1, max_length=8
    )
    """Hidden layer sizes of the MLP, or of the fully connected head after the CNN."""

    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation of the MLP."""


class OptimizerSpec(SpecModel):
    """Optimiser settings, as RLlib's IMPALA opt_type/decay/momentum/epsilon."""

    type: Literal["adam", "rmsprop"] = "adam"
    """adam or rmsprop."""

    decay: float = Field(default=0.99, ge=0.0, le=1.0)
    """RMSProp smoothing constant (alpha)."""

    momentum: float = Field(default=0.0, ge=0.0, lt=1.0)
    """RMSProp momentum."""

    epsilon: float | None = Field(default=None, gt=0.0, le=1.0)
    """Denominator epsilon, added after the square root as torch does (TensorFlow adds it inside:
    its 0.01 is about 0.1 here); omitted means 1e-8 for adam and 0.1 for rmsprop (RLlib's)."""


class TrainingSpec(SpecModel):
    """Algorithm hyperparameters: RLlib IMPALAConfig names in camelCase, RLlib defaults."""

    mode: Literal["vtrace", "async-gradients"] = "vtrace"
    """vtrace: IMPALA with V-trace off-policy correction; async-gradients: A3C-style workers."""

    seed: int | None = Field(default=None, ge=0)
    """Seed for environments and networks; omitted means random."""

    lr: float = Field(default=5e-4, gt=0.0, le=1.0)
    """Learning rate (used when lrSchedule is omitted)."""

    lr_schedule: Schedule | None = None
    """Piecewise-linear learning rate over env steps trained (RLlib's old-stack clock; each
    batch counts once, whatever numSgdIter): [[timestep, lr], ...]."""

    gamma: float = Field(default=0.99, ge=0.0, le=1.0)
    """Discount factor."""

    train_batch_size: int = Field(default=500, ge=1, le=1_000_000)
    """Env steps per learner update (fragments are concatenated up to this size)."""

    rollout_fragment_length: int = Field(default=50, ge=1, le=10_000)
    """Time steps per fragment a rollout worker returns, per environment."""

    vtrace_clip_rho_threshold: float = Field(default=1.0, gt=0.0)
    """V-trace rho-bar: clip on importance weights in the value target."""

    vtrace_clip_pg_rho_threshold: float = Field(default=1.0, gt=0.0)
    """V-trace clip on importance weights in the policy-gradient advantage."""

    vf_loss_coeff: float = Field(default=0.5, ge=0.0)
    """Weight of the value-function loss."""

    entropy_coeff: float = Field(default=0.01, ge=0.0)
    """Weight of the entropy bonus (used when entropyCoeffSchedule is omitted)."""

    entropy_coeff_schedule: Schedule | None = None
    """Piecewise-linear entropy coefficient over env steps trained: [[timestep, coeff], ...]."""

    grad_clip: float | None = Field(default=40.0, gt=0.0)
    """Global-norm gradient clip; null disables clipping."""

    optimizer: OptimizerSpec = Field(default_factory=OptimizerSpec)
    """Optimiser type and its parameters."""

    separate_vf_optimizer: bool = False
    """Train the value head with its own optimiser at lrVf."""

    lr_vf: float = Field(default=5e-4, gt=0.0, le=1.0)
    """Learning rate of the separate value-function optimiser. An lrSchedule scales it by the
    same factor as lr (RLlib's old stack sets both optimisers to the schedule's value, which
    would discard lrVf)."""

    num_sgd_iter: int = Field(default=1, ge=1, le=64)
    """Passes the minibatch buffer replays each train batch."""

    minibatch_buffer_size: int = Field(default=1, ge=1, le=1024)
    """Train batches held by the minibatch buffer while they are replayed."""

    learner_queue_size: int = Field(default=16, ge=1, le=4096)
    """Capacity of the learner's inbound queue of train batches (RLlib's old stack: 16; its
    current default is 3)."""

    learner_queue_timeout: float = Field(default=300.0, gt=0.0)
    """Seconds the learner may wait for a batch before the run fails as starved."""

    num_multi_gpu_tower_stacks: int = Field(default=1, ge=1, le=64)
    """Buffer slots per device for the multi-device learner (loaders fill idle ones)."""

    num_gpu_loader_threads: int = Field(default=8, ge=1, le=64)
    """Threads copying train batches into idle tower stacks (multi-device learner)."""

    broadcast_interval: int = Field(default=1, ge=1, le=10_000)
    """Learner updates between weight broadcasts to the rollout workers."""

    max_requests_in_flight_per_worker: int = Field(default=2, ge=1, le=64)
    """Sample requests outstanding per rollout worker (asynchronous sampling; RLlib's old stack:
    2, its current default is 1)."""

    replay_batches_per_fresh: float = Field(default=0.0, ge=0.0, le=100.0)
    """Mixin replay: train batches replayed per fresh train batch, in expectation (the integer
    part always, the fraction with that probability); 0 disables replay. Not RLlib's
    replay_proportion, whose p means 1/(p-1) replayed fragments per new one (RENAMED_RLLIB)."""

    replay_buffer_batches: int = Field(default=0, ge=0, le=1_000_000)
    """Mixin replay capacity, in train batches (RLlib's slots hold one worker sample each)."""

    @field_validator("lr_schedule")
    @classmethod
    def _lr_schedule(cls, v: Schedule | None) -> Schedule | None:
        return _check_schedule(v, "lrSchedule")

    @field_validator("entropy_coeff_schedule")
    @classmethod
    def _entropy_schedule(cls, v: Schedule | None) -> Schedule | None:
        return _check_schedule(v, "entropyCoeffSchedule")

    @model_validator(mode="after")
    def _replay(self) -> TrainingSpec:
        if self.replay_batches_per_fresh > 0 and self.replay_buffer_batches == 0:
            raise ValueError(
                "replayBatchesPerFresh > 0 needs replayBufferBatches >= 1 (the replay capacity)"
            )
        return self


class Toleration(SpecModel):
    """A Kubernetes toleration (core/v1 Toleration)."""

    key: str | None = None
    """Taint key the toleration applies to."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal."""
    value: str | None = None
    """Taint value to match with Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """How long a NoExecute taint is tolerated."""


Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$")]


class Resources(SpecModel):
    """Container requests and limits, as core/v1 ResourceRequirements (quantities as strings)."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Minimum resources, e.g. {cpu: "1", memory: 2Gi}."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Maximum resources."""


RESERVED_ENV = ("POD_IP", "POD_NAME", "POD_NAMESPACE", "HOME", "PYTHONUNBUFFERED")
"""Variables the operator sets in every container (Ray advertises POD_IP; caches live in HOME)."""
RESERVED_ENV_PREFIXES = ("IMPALA_", "RAY_")
"""The trainer's and Ray's own settings: the operator sets them from the spec."""
RESERVED_VOLUMES = ("config", "run", "checkpoints", "auth", "tmp", "shm")
"""Volume names the operator's pods use."""
RESERVED_PATHS = ("/tmp", "/dev/shm", "/etc/impalajob", "/etc/impalajob-auth", "/var/lib/impalajob")
"""Mount points the operator's containers use (and what lies under them)."""
VOLUME_SOURCES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
)
"""The volume types the restricted Pod Security Standard allows (hostPath and the in-tree
network volumes are not): the only ones a pod override may add."""

# The pod overrides' refusals, shared with the CRD's CEL rules (operator/impala_operator/cel.py)
# so the API server and `impalajob validate` say the same words.
RESERVED_ENV_MESSAGE = (
    f"env: {', '.join(RESERVED_ENV)} and {'*, '.join(RESERVED_ENV_PREFIXES)}* are set by the "
    "operator; set the spec field they come from instead"
)
RESERVED_VOLUME_MESSAGE = (
    f"volumes: the names {', '.join(RESERVED_VOLUMES)} are the operator's; pick another"
)
ONE_VOLUME_SOURCE_MESSAGE = f"volumes: each needs exactly one of {', '.join(VOLUME_SOURCES)}"
RESERVED_PATH_MESSAGE = (
    f"volumeMounts: {', '.join(RESERVED_PATHS)} and what lies under them are the operator's mounts"
)
MOUNT_NAMES_VOLUME_MESSAGE = "volumeMounts: each must name one of this pod override's volumes"


class EnvVar(SpecModel):
    """A core/v1 EnvVar for the role's main container."""

    name: str = Field(min_length=1, max_length=253)
    """Variable name."""

    value: str | None = None
    """Literal value."""

    value_from: dict[str, Any] | None = None
    """core/v1 EnvVarSource: secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef."""

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if v in RESERVED_ENV or v.startswith(RESERVED_ENV_PREFIXES):
            raise ValueError(RESERVED_ENV_MESSAGE)
        return v


class EnvFromSource(SpecModel):
    """A core/v1 EnvFromSource: every key of a ConfigMap or Secret as variables."""

    config_map_ref: dict[str, Any] | None = None
    """{name, optional}."""

    secret_ref: dict[str, Any] | None = None
    """{name, optional}."""

    prefix: str | None = None
    """Prepended to every key."""


class Volume(SpecModel):
    """A core/v1 Volume of a type the restricted Pod Security Standard allows."""

    name: str = Field(min_length=1, max_length=63)
    """Volume name (referenced by volumeMounts)."""

    config_map: dict[str, Any] | None = None
    secret: dict[str, Any] | None = None
    empty_dir: dict[str, Any] | None = None
    persistent_volume_claim: dict[str, Any] | None = None
    projected: dict[str, Any] | None = None
    downward_api: dict[str, Any] | None = Field(default=None, alias="downwardAPI")
    csi: dict[str, Any] | None = None
    ephemeral: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _allowed_source(cls, data: Any) -> Any:
        if isinstance(data, dict):
            refused = [k for k in data if k != "name" and k not in VOLUME_SOURCES]
            if refused:
                raise ValueError(
                    f"volume type {refused[0]} is refused: the operator keeps every pod within "
                    "the restricted Pod Security Standard, which allows only "
                    f"{', '.join(VOLUME_SOURCES)} (use a persistentVolumeClaim for host data)"
                )
        return data

    @model_validator(mode="after")
    def _one_source(self) -> Volume:
        set_sources = [k for k in VOLUME_SOURCES if getattr(self, _snake(k)) is not None]
        if len(set_sources) != 1:
            raise ValueError(ONE_VOLUME_SOURCE_MESSAGE)
        if self.name in RESERVED_VOLUMES:
            raise ValueError(RESERVED_VOLUME_MESSAGE)
        return self


def _snake(camel: str) -> str:
    """A volume source's field name on the model (downwardAPI keeps its acronym)."""
    if camel == "downwardAPI":
        return "downward_api"
    return re.sub(r"(?<!^)([A-Z])", r"_\1", camel).lower()


class VolumeMount(SpecModel):
    """A core/v1 VolumeMount of one of the override's volumes into the main container."""

    name: str = Field(min_length=1, max_length=63)
    """A volume of this override (or a volume the operator exposes: none today)."""

    mount_path: str = Field(min_length=1)
    """Where in the container."""

    read_only: bool | None = None
    """Mount read-only (default false)."""

    sub_path: str | None = None
    """A path inside the volume to mount instead of its root."""

    @field_validator("mount_path")
    @classmethod
    def _not_reserved(cls, v: str) -> str:
        if any(v == p or v.startswith(p + "/") for p in RESERVED_PATHS):
            raise ValueError(RESERVED_PATH_MESSAGE)
        return v


class PodOverrides(SpecModel):
    """Settings merged onto the pods the operator builds for a role (not a full pod template:
    what would break the restricted Pod Security Standard the pods keep, such as privileged
    containers, host namespaces or hostPath volumes, has no field here and is refused)."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Extra pod labels (the operator's own app.kubernetes.io/* labels win)."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """Extra pod annotations (e.g. for a service mesh or a log shipper)."""

    env: list[EnvVar] = Field(default_factory=list, max_length=256)
    """Extra variables for the main container (W&B keys, S3 credentials from a Secret...)."""

    env_from: list[EnvFromSource] = Field(default_factory=list, max_length=64)
    """Variables from whole ConfigMaps or Secrets."""

    image_pull_secrets: list[dict[str, str]] = Field(default_factory=list, max_length=16)
    """Secrets ({name}) to pull a private image with."""

    volumes: list[Volume] = Field(default_factory=list, max_length=64)
    """Extra volumes (restricted-PSS types only)."""

    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=64)
    """Mounts of those volumes into the main container."""

    affinity: dict[str, Any] | None = None
    """core/v1 Affinity (node and pod (anti-)affinity)."""

    priority_class_name: str | None = None
    """PriorityClass of the pods."""

    scheduler_name: str | None = None
    """Scheduler that places the pods (e.g. a gang scheduler)."""

    service_account_name: str | None = None
    """ServiceAccount the pods run as (its token is still not mounted: the trainer never calls
    the Kubernetes API; cloud workload identities that inject their own token still work)."""

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PodOverrides:
        names = {v.name for v in self.volumes}
        if any(mount.name not in names for mount in self.volume_mounts):
            raise ValueError(MOUNT_NAMES_VOLUME_MESSAGE)
        return self


class LearnerSpec(SpecModel):
    """The learner pod: Ray head, IMPALA driver and learner threads."""

    gpus: int = Field(default=0, ge=0, le=16)
    """GPUs for the learner; more than one uses the multi-device learner (one tower per GPU)."""

    termination_grace_period_seconds: int = Field(default=120, ge=1, le=86_400)
    """SIGTERM to SIGKILL for the learner pod: time to write the final checkpoint (a large
    model on a slow volume needs more)."""

    fake_devices: int = Field(default=0, ge=0, le=16)
    """With gpus 0: run the multi-device learner on this many CPU towers (like _fake_gpus)."""

    resources: Resources = Field(default_factory=Resources)
    """Learner container resources (GPU requests are added from gpus)."""

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


class AggregatorsSpec(ReplicaGroupSpec):
    """Aggregator pods: concatenate fragments into train batches and mix in replay."""

    min_replicas: int = Field(default=0, ge=0, le=1000)
    """Fewest aggregator pods (0: the driver aggregates)."""

    max_replicas: int = Field(default=0, ge=0, le=1000)
    """Most aggregator pods."""


NO_STOP_CRITERION = (
    "spec.stop must set at least one of timesteps, episodeReturnMean, timeLimitSeconds "
    "(without one the job would train forever)"
)
"""The message for an empty `spec.stop`, from the model and from the CRD's CEL rule alike."""


class StopSpec(SpecModel):
    """When training ends successfully; the first criterion met stops it. At least one is set."""

    timesteps: int | None = Field(default=None, ge=1)
    """Env steps sampled."""

    episode_return_mean: float | None = None
    """Mean return over the last 100 episodes."""

    time_limit_seconds: float | None = Field(default=None, gt=0.0)
    """Wall-clock seconds of training."""

    @model_validator(mode="after")
    def _some_criterion(self) -> StopSpec:
        if (
            self.timesteps is None
            and self.episode_return_mean is None
            and (self.time_limit_seconds is None)
        ):
            raise ValueError(NO_STOP_CRITERION)
        return self


STORAGE_URI_PATTERN = r"^s3://[a-z0-9][-.a-z0-9]{1,61}[a-z0-9](/[^\s]*)?$"
"""`s3://bucket[/prefix]` with an S3 bucket name (3-63 lowercase letters, digits, dots, dashes)."""
SECRET_REF_NEEDS_URI = (
    "checkpoint.secretRef holds the credentials of checkpoint.storageUri: set storageUri "
    "(s3://bucket/prefix) or remove secretRef"
)


class SecretReference(SpecModel):
    """A Secret in the job's namespace (core/v1 LocalObjectReference)."""

    name: str = Field(pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$", max_length=253)
    """The Secret's name."""


class CheckpointSpec(SpecModel):
    """Checkpointing of model, optimiser and counters."""

    interval_seconds: float = Field(default=60.0, gt=0.0)
    """Seconds between checkpoints (one is always written at the end)."""

    keep: int = Field(default=3, ge=1, le=1000)
    """Newest checkpoints kept."""

    volume_claim: str | None = Field(default=None, pattern=r"^[a-z0-9]([-.a-z0-9]*[a-z0-9])?$")
    """Existing PersistentVolumeClaim holding the whole run directory (cluster only): checkpoints,
    summary.json, history.jsonl, TensorBoard files and the trainer's log outlive the learner pod,
    and each learner attempt resumes from it. One claim per job. Without a claim or a storageUri
    the run directory is an emptyDir and dies with the pod (the operator warns with an Event)."""

    storage_uri: str | None = Field(default=None, pattern=STORAGE_URI_PATTERN)
    """An S3-compatible location (`s3://bucket/prefix`) the run directory is mirrored to: each
    checkpoint as it is written, then summary.json, history.jsonl, config.yaml and the TensorBoard
    files, and everything once more at the end. A learner with no local checkpoint (a new pod,
    a new machine) resumes from the newest one there. The prefix belongs to one job: another
    job's run there is refused, not overwritten. Credentials and endpoint come from `secretRef`
    on a cluster and from the usual AWS_* variables locally."""

    secret_ref: SecretReference | None = None
    """Secret whose keys become the learner's environment for `storageUri`: AWS_ACCESS_KEY_ID,
    AWS_SECRET_ACCESS_KEY, and for S3-compatible stores AWS_ENDPOINT_URL and AWS_REGION."""

    @field_validator("storage_uri", mode="before")
    @classmethod
    def _s3_uri(cls, value: Any) -> Any:
        # Before the pattern, to say what is wrong in words rather than as a regex.
        if isinstance(value, str) and not re.match(STORAGE_URI_PATTERN, value):
            raise ValueError(
                "must be s3://BUCKET or s3://BUCKET/PREFIX (any S3-compatible store; the bucket "
                "is 3-63 lowercase letters, digits, dots and dashes, no spaces)"
            )
        return value

    @model_validator(mode="after")
    def _secret_needs_uri(self) -> CheckpointSpec:
        if self.secret_ref is not None and self.storage_uri is None:
            raise ValueError(SECRET_REF_NEEDS_URI)
        return self


class RunPolicy(SpecModel):
    """Job lifecycle on the cluster (ignored by local runs)."""

    suspend: bool = False
    """Scale everything to zero and keep the checkpoint; false resumes."""

    backoff_limit: int = Field(default=3, ge=0, le=1000)
    """Learner failures retried (each attempt resumes from the latest checkpoint) before the job
    fails. A disruption (eviction, preemption, node shutdown or loss, spot reclaim: a
    DisruptionTarget condition or a SIGTERM exit) restarts the learner without using one."""

    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Seconds since start after which the job fails with DeadlineExceeded."""

    startup_deadline_seconds: int | None = Field(default=None, ge=1)
    """Seconds a learner may take to become ready (from the job's start or its last running
    attempt: scheduling, image pull, start-up) before the job fails with
    StartupDeadlineExceeded, like KubeRay's preRunningDeadlineSeconds: a learner no node can
    fit fails the job instead of waiting forever. Omitted: no limit."""

    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Seconds after Succeeded/Failed after which the ImpalaJob is deleted."""

    clean_pod_policy: Literal["All", "Running", "None"] = "Running"
    """Pods removed when the job finishes. Running (the default): what still runs (rollout and
    aggregator pods, which only served the learner) goes, the finished learner pod stays with its
    logs and exit status. All: the learner pod too (its logs go with it). None: nothing, the
    rollout and aggregator Deployments keep running until the job is deleted."""

    learner_disruption_budget: bool = True
    """A PodDisruptionBudget (minAvailable 1) on the learner pod: `kubectl drain` and other
    evictions wait for the job to end instead of interrupting it. False lets a drain take the
    learner (it resumes from the checkpoint elsewhere, without using a retry)."""


class ImpalaJobSpec(SpecModel):
    """What to train and how to run it."""

    image: str = Field(default="impalajob:0.1.0", min_length=1)
    """Container image every role runs (cluster only)."""

    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    """Image pull policy (cluster only)."""

    env: EnvSpec = Field(default_factory=EnvSpec)
    """Environment (immutable after creation)."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    """Network (immutable after creation)."""

    training: TrainingSpec = Field(default_factory=TrainingSpec)
    """Algorithm hyperparameters."""

    learner: LearnerSpec = Field(default_factory=LearnerSpec)
    """Learner pod."""

    rollouts: RolloutsSpec = Field(default_factory=RolloutsSpec)
    """Rollout pods."""

    aggregators: AggregatorsSpec = Field(default_factory=AggregatorsSpec)
    """Aggregator pods."""

    stop: StopSpec
    """Stop criteria (required: a job ends when one is met)."""

    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    """Checkpointing."""

    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    """Lifecycle policy (cluster only)."""


class ObjectMeta(BaseModel):
    """The subset of metadata the job uses; other keys (uid, resourceVersion...) pass through."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    """Job name: a DNS-1035 label of at most 40 characters."""

    namespace: str | None = None
    """Namespace (cluster only)."""

    labels: dict[str, str] = Field(default_factory=dict)
    """Labels, copied onto every child."""

    annotations: dict[str, str] = Field(default_factory=dict)
    """Annotations."""

    @field_validator("name")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS1035.match(v):
            raise ValueError(
                "must be lowercase letters, digits and '-', start with a letter and end with a "
                "letter or digit (DNS-1035 label)"
            )
        return v


class ImpalaJob(BaseModel):
    """An ImpalaJob manifest (impala.dev/v1alpha1)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    api_version: Literal["impala.dev/v1alpha1"] = Field(
        default="impala.dev/v1alpha1", alias="apiVersion"
    )
    kind: Literal["ImpalaJob"] = "ImpalaJob"
    metadata: ObjectMeta
    spec: ImpalaJobSpec
    # Status is written by the operator; a manifest read back from the cluster may carry it.
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    def to_manifest(self) -> dict[str, Any]:
        """The manifest as camelCase JSON-ready data, with defaults filled in."""
        return self.model_dump(mode="json", by_alias=True, exclude={"status"})
