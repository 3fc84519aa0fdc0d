"""What to train: the environment, the model, the hyperparameters (RLlib's IMPALAConfig names in
camelCase, with RLlib's defaults except DEFAULTS_APART_FROM_RLLIB; RLlib names whose meaning differs
here are refused, RENAMED_RLLIB) and the stop criteria."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from impala_api.spec.base import POLICY_NAME_PATTERN, Schedule, SpecModel, check_schedule

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
        "(bench/rollout_ceiling.py); RLlib's num_envs_per_env_runner is 1",
    ),
    "training.learnerQueueSize": (
        3,
        "16, the default of RLlib's old stack, whose LearnerThread this mirrors (RLlib now says "
        "3); the queue never drops a batch here, it holds back the actors, so its size bounds "
        "memory and policy lag only",
    ),
    "model.maxSeqLen": (
        20,
        "the whole fragment: the learner unrolls each fragment column from the state it began "
        "with, as the paper's learner does, and chunks it only when maxSeqLen is set (which must "
        "divide rolloutFragmentLength: nothing is padded, where RLlib pads to 20)",
    ),
    "training.entropyCoeff": (
        0.01,
        "by the action space: 0.01 as RLlib's, and 0.001 for Box actions, whose default is PopArt "
        "(advantages of unit scale); the trainer sets it and `impalajob validate` says which",
    ),
    "training.maxRequestsInFlightPerWorker": (
        1,
        "2, the old stack's max_requests_in_flight_per_sampler_worker: a worker samples its next "
        "fragment while the last one is in transit (RLlib now says 1 per env runner)",
    ),
}
"""Defaults that differ from RLlib's IMPALAConfig (field -> (RLlib's default, why ours)).
tests/unit/api/test_spec.py compares every default with RLlib's."""


_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
IMPORT_PATH_PATTERN = rf"^{_NAME}(\.{_NAME})*[:.]{_NAME}$"
"""`package.module:Name` (or `package.module.Name`): something of the user's to import."""
PETTINGZOO_PATTERN = rf"^{_NAME}(\.{_NAME})*(:{_NAME})?$"
"""A PettingZoo env: its module (`mpe2.simple_spread_v3`) or `package.module:constructor`."""
DEFAULT_ENV_ID = "CartPole-v1"
ENTROPY_COEFF = 0.01
"""training.entropyCoeff where neither the manifest nor the action space sets it (IMPALA's)."""
PETTINGZOO_OR_ID = (
    "spec.env.id names a gymnasium env and spec.env.pettingzoo a PettingZoo one: set one of them"
)


class WrapperSpec(SpecModel):
    """One of your gymnasium wrappers, applied to every sub-env in list order."""

    import_path: str = Field(alias="import", pattern=IMPORT_PATH_PATTERN)
    """Import path of a gymnasium.Wrapper subclass (or any callable env -> env), e.g.
    `mygrid.wrappers:TimeLimitPenalty`. Its package must be installed wherever the env is made:
    the image of a cluster job, the machine of `impalajob train`."""

    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to it after the env."""


class EnvSpec(SpecModel):
    """The environment every rollout worker steps."""

    id: str = Field(default=DEFAULT_ENV_ID, min_length=1)
    """Gymnasium environment id: a registered one (CartPole-v1, ALE/Pong-v5: Atari ROMs ship in
    ale-py), or gymnasium's `module:Env-vN`, whose module is imported (and registers the id)
    wherever the env is made: `impalajob validate`, the driver and every rollout worker."""

    pettingzoo: str | None = Field(default=None, pattern=PETTINGZOO_PATTERN, max_length=256)
    """A multi-agent env on PettingZoo's API instead of `id`: the env's module, whose
    `parallel_env(**kwargs)` is called (`mpe2.simple_spread_v3`; a module with only `env()`, as
    PettingZoo's classic games, gets that, an AEC env stepped turn by turn), or
    `package.module:constructor` returning a ParallelEnv or an AECEnv. Its agents act by the
    policies of spec.multiAgent (one shared policy when omitted)."""

    wrappers: list[WrapperSpec] = Field(default_factory=list, max_length=16)
    """Your own wrappers around each sub-env, innermost first, applied to the env gymnasium
    makes (before the Atari preprocessing of `ALE/` ids: such a job steps its games through
    Python wrappers instead of ale-py's C++ vector env, ~25% more rollout CPU)."""

    num_envs_per_worker: int = Field(default=16, ge=1, le=4096)
    """Environments each rollout worker steps as one vector env with batched inference (RLlib's
    default is 1: DEFAULTS_APART_FROM_RLLIB says why not here)."""

    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments passed to gymnasium.make. For `ALE/` ids the C++ vector env takes
    repeat_action_probability (default 0.25), full_action_space and
    max_num_frames_per_episode; any other ALE option (mode, difficulty, ...) is honoured through
    the Python wrapper stack instead (~25% more rollout CPU)."""

    frame_stack: int | None = Field(default=None, ge=1, le=16)
    """Frames stacked per observation (Atari; defaults to 4 for ALE/ environments)."""

    frame_skip: int = Field(default=4, ge=1, le=16)
    """Atari frame skip applied by the preprocessing wrapper."""

    clip_rewards: bool | None = None
    """Train on the sign of each reward (-1, 0, 1), as the paper and RLlib do for Atari; the
    reported episode returns stay unclipped. Default: on for ALE/ environments, off otherwise."""

    @model_validator(mode="after")
    def _one_env(self) -> EnvSpec:
        if self.pettingzoo is not None and self.id != DEFAULT_ENV_ID:
            raise ValueError(PETTINGZOO_OR_ID)
        return self

    @property
    def is_pettingzoo(self) -> bool:
        """A PettingZoo env (spec.env.pettingzoo), not a gymnasium one."""
        return self.pettingzoo is not None

    @property
    def name(self) -> str:
        """The env as the manifest names it: its PettingZoo constructor, else its id."""
        return self.pettingzoo or self.id

    @property
    def module(self) -> str | None:
        """The module `id` names to import first (`module:Env-vN`), or None."""
        return self.id.split(":", 1)[0] if ":" in self.id else None

    @property
    def registered_id(self) -> str:
        """The id as gymnasium's registry knows it (`id` without its `module:` part)."""
        return self.id.split(":", 1)[1] if ":" in self.id else self.id

    @property
    def is_atari(self) -> bool:
        return self.registered_id.startswith("ALE/")

    @property
    def clips_rewards(self) -> bool:
        return self.is_atari if self.clip_rewards is None else self.clip_rewards

    @property
    def stacked_frames(self) -> int:
        if self.frame_stack is not None:
            return self.frame_stack
        return 4 if self.is_atari else 1


CUSTOM_MODEL_IMPORT = (
    "spec.model.type custom needs spec.model.import (package.module:Class), and "
    "spec.model.import is only read with type custom"
)
CUSTOM_MODEL_LSTM = (
    "spec.model.useLstm wraps the built-in networks; a custom model is recurrent by its own "
    "state_size (docs/models.md): drop useLstm or use a built-in type"
)
PREV_ACTION_REWARD_LSTM = (
    "spec.model.lstmUsePrevActionReward feeds the LSTM core: it needs spec.model.useLstm: true"
)

POPART_NEEDS_VTRACE = (
    "spec.model.popart rewrites the value head as the learner's statistics of the V-trace "
    "targets move, and spec.training.mode async-gradients has no such learner (the driver "
    "applies each worker's gradients): use popart false, or mode vtrace"
)

STOP_POLICY_NEEDS_RETURN = (
    "spec.stop.policy names the policy whose return spec.stop.episodeReturnMean measures: set "
    "episodeReturnMean too"
)
MAX_SEQ_LEN_DIVIDES = (
    "spec.model.maxSeqLen must divide spec.training.rolloutFragmentLength (each fragment is cut "
    "into whole sequences; nothing is padded)"
)


class ModelSpec(SpecModel):
    """The policy/value network."""

    type: Literal["auto", "mlp", "cnn", "resnet", "custom"] = "auto"
    """mlp for vector observations; cnn (the IMPALA paper's shallow CNN) or resnet (its deep
    network: 3 stacks of conv, max-pool and 2 residual blocks, 16/32/32 channels) for [C, H, W]
    frames; auto picks cnn for [C, H, W] frames of at least 20x20, else mlp; custom is your
    class, `import`."""

    hidden: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [256, 256], min_length=1, max_length=8
    )
    """Hidden layer sizes of the MLP, or of the fully connected head after the CNN."""

    activation: Literal["tanh", "relu"] = "tanh"
    """Hidden activation of the MLP."""

    use_lstm: bool = False
    """Put an LSTM core between the network and its heads (RLlib's use_lstm): the workers carry
    its state across steps, the learner unrolls each sequence from the state it began with."""

    lstm_cell_size: int = Field(default=256, ge=1, le=8192)
    """Units of the LSTM core."""

    lstm_use_prev_action_reward: bool = False
    """Also feed the LSTM core the previous action (one-hot, or the Box sample) and reward,
    zeros at an episode's start (RLlib's lstm_use_prev_action_reward); in a PettingZoo env each
    agent's own last action and reward."""

    max_seq_len: int | None = Field(default=None, ge=1, le=10_000)
    """Steps the learner unrolls a recurrent model through before it restarts from a state the
    worker recorded (truncated backpropagation through time); must divide
    rolloutFragmentLength. Omitted: the whole fragment, as the paper's learner unrolls."""

    free_log_std: bool = False
    """Box actions: the Gaussian's log-std as parameters of their own, state-independent
    (RLlib's free_log_std), instead of outputs of the policy head."""

    squash_actions: bool | None = None
    """Box actions: the env gets the Gaussian's sample squashed into the space's bounds by tanh
    (true: SAC's and Brax's squashed Gaussian, whose entropy is the squashed action's, so the
    entropy bonus keeps the actions apart) or clipped to them (false: RLlib's clip_actions); the
    learner scores the sample either way. Omitted: true where every bound is finite, else false
    (`impalajob validate` says which)."""

    popart: bool | None = None
    """Normalise the value function with PopArt (Hessel et al. 2019, the IMPALA authors'): the
    value head learns in units of the V-trace targets' running mean and scale, its last layer
    rewritten whenever they move so its outputs stay exactly the same, and the policy gradient's
    advantages are divided by that scale, so rewards of any scale train alike with the same
    learning rate and entropy coefficient. Needs a value_head of one nn.Linear output (every
    built-in model has one); not with training.mode async-gradients. Omitted: true for Box
    actions with a built-in model in vtrace mode (advantages in the return's units outweighed
    the entropy bonus and made the policy deterministic before it learned), else false
    (`impalajob validate` says which)."""

    import_path: str | None = Field(default=None, alias="import", pattern=IMPORT_PATH_PATTERN)
    """type custom: your model class, `package.module:Class`, a subclass of
    impala_trainer.learning.models.ActorCritic called as Class(obs_shape, num_outputs,
    **config) (docs/models.md). Its package must be installed wherever the job runs."""

    config: dict[str, Any] = Field(default_factory=dict)
    """type custom: keyword arguments for your model class."""

    @model_validator(mode="after")
    def _custom(self) -> ModelSpec:
        if (self.type == "custom") != (self.import_path is not None):
            raise ValueError(CUSTOM_MODEL_IMPORT)
        if self.type == "custom" and self.use_lstm:
            raise ValueError(CUSTOM_MODEL_LSTM)
        if self.lstm_use_prev_action_reward and not self.use_lstm:
            raise ValueError(PREV_ACTION_REWARD_LSTM)
        return self


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

    @property
    def epsilon_or_default(self) -> float:
        """epsilon as given, else the optimiser's default: 1e-8 for adam, 0.1 for rmsprop."""
        if self.epsilon is not None:
            return self.epsilon
        return 1e-8 if self.type == "adam" else 0.1


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

    surrogate_clip: float | None = Field(default=None, gt=0.0, lt=1.0)
    """The policy loss as APPO's clipped surrogate, min(r A, clip(r, 1 - c, 1 + c) A) with r the
    learner's probability of the action over the acting policy's and A the V-trace advantage,
    at this c (RLlib APPO's clip_param). Past the clip a batch that an older policy sampled
    stops pushing the learner's further from it. Omitted: 0.3 for Box actions (a Gaussian
    learned and then collapsed under V-trace's policy gradient at IMPALA's usual policy lag;
    `impalajob validate` says so), V-trace's policy gradient (IMPALA's) for discrete ones."""

    vf_loss_coeff: float = Field(default=0.5, ge=0.0)
    """Weight of the value-function loss."""

    entropy_coeff: float | None = Field(default=None, ge=0.0)
    """Weight of the entropy bonus (used when entropyCoeffSchedule is omitted). Omitted: 0.01
    (IMPALA's and RLlib's), or 0.001 where model.popart is true by default (Box actions): the
    advantages it weighs against are then in units of the return's scale."""

    entropy_coeff_schedule: Schedule | None = None
    """Piecewise-linear entropy coefficient over env steps trained: [[timestep, coeff], ...]."""

    @property
    def entropy_coeff_or_default(self) -> float:
        """entropyCoeff as given (or as the trainer's space defaults set it), else 0.01."""
        return ENTROPY_COEFF if self.entropy_coeff is None else self.entropy_coeff

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
        return check_schedule(v, "lrSchedule")

    @field_validator("entropy_coeff_schedule")
    @classmethod
    def _entropy_schedule(cls, v: Schedule | None) -> Schedule | None:
        return check_schedule(v, "entropyCoeffSchedule")

    @model_validator(mode="after")
    def _replay(self) -> TrainingSpec:
        if self.replay_batches_per_fresh > 0 and self.replay_buffer_batches == 0:
            raise ValueError(
                "replayBatchesPerFresh > 0 needs replayBufferBatches >= 1 (the replay capacity)"
            )
        return self


NO_STOP_CRITERION = (
    "spec.stop must set at least one of timesteps, episodeReturnMean, evaluationReturnMean, "
    "timeLimitSeconds "
    "(without one the job would train forever)"
)
"""The message for an empty `spec.stop`, from the model and from the CRD's CEL rule alike."""


class StopSpec(SpecModel):
    """When training ends successfully; the first criterion met stops it. At least one is set."""

    timesteps: int | None = Field(default=None, ge=1)
    """Env steps sampled."""

    episode_return_mean: float | None = None
    """Mean return over the last 100 episodes."""

    evaluation_return_mean: float | None = None
    """Mean return of the latest evaluation (needs spec.evaluation)."""

    time_limit_seconds: float | None = Field(default=None, gt=0.0)
    """Wall-clock seconds of training."""

    policy: str | None = Field(default=None, pattern=POLICY_NAME_PATTERN, max_length=32)
    """A PettingZoo env's policy whose return episodeReturnMean measures: its agents' mean
    return over their last 100 episodes (one per agent and episode), which the CR's progress
    then follows. Omitted: the team's return (every agent's rewards, per episode)."""

    @model_validator(mode="after")
    def _some_criterion(self) -> StopSpec:
        if (
            self.timesteps is None
            and self.episode_return_mean is None
            and self.evaluation_return_mean is None
            and (self.time_limit_seconds is None)
        ):
            raise ValueError(NO_STOP_CRITERION)
        if self.policy is not None and self.episode_return_mean is None:
            raise ValueError(STOP_POLICY_NEEDS_RETURN)
        return self
