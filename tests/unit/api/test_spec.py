"""The ImpalaJob model: RLlib defaults, camelCase on the wire, and errors that name the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from impala_api.manifest import (
    ManifestError,
    apply_overrides,
    load_manifest,
    load_population,
    manifest_kind,
    parse_manifest,
)
from impala_api.spec import (
    DEFAULTS_APART_FROM_RLLIB,
    ImpalaJob,
    ImpalaJobSpec,
    TrainingSpec,
)
from tests.support.jobs import job_manifest

EXAMPLES = Path(__file__).resolve().parents[3] / "manifests" / "examples"


def _problems(spec: dict) -> list[str]:
    with pytest.raises(ManifestError) as exc:
        parse_manifest(job_manifest(spec=spec))
    return exc.value.problems


def test_rllib_impala_defaults() -> None:
    t = TrainingSpec()
    assert (t.lr, t.gamma, t.rollout_fragment_length, t.train_batch_size) == (5e-4, 0.99, 50, 500)
    assert (t.vtrace_clip_rho_threshold, t.vtrace_clip_pg_rho_threshold) == (1.0, 1.0)
    assert (t.vf_loss_coeff, t.entropy_coeff_or_default, t.grad_clip) == (0.5, 0.01, 40.0)
    assert (t.learner_queue_size, t.learner_queue_timeout) == (16, 300.0)
    assert (t.num_sgd_iter, t.minibatch_buffer_size, t.num_multi_gpu_tower_stacks) == (1, 1, 1)
    assert (t.broadcast_interval, t.replay_batches_per_fresh) == (1, 0.0)


def test_camel_case_round_trip() -> None:
    job = parse_manifest(job_manifest(training={"trainBatchSize": 1000, "vfLossCoeff": 0.25}))
    assert job.spec.training.train_batch_size == 1000
    manifest = job.to_manifest()
    assert manifest["spec"]["training"]["trainBatchSize"] == 1000
    assert manifest["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    assert ImpalaJob.model_validate(manifest) == job


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_are_valid(path: Path) -> None:
    if manifest_kind(path) == "ImpalaPopulation":
        assert load_population(path).kind == "ImpalaPopulation"
    else:
        assert load_manifest(path).kind == "ImpalaJob"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"training": {"numSgdIter": 0}},
         ["spec.training.numSgdIter", "got 0", ">= 1"]),
        ({"training": {"lr": -1}}, ["spec.training.lr", "got -1", "> 0.0"]),
        ({"training": {"gamma": 1.5}}, ["spec.training.gamma", "got 1.5", "<= 1.0"]),
        ({"training": {"optimizer": {"type": "sgd"}}},
         ["spec.training.optimizer.type", "'adam' or 'rmsprop'", "got 'sgd'"]),
        ({"training": {"trainBatchSise": 10}},
         ["spec.training.trainBatchSise", "unknown field", "did you mean 'trainBatchSize'"]),
        ({"rollouts": {"minReplicas": 5, "maxReplicas": 2}},
         ["spec.rollouts", "minReplicas (5) must be <= maxReplicas (2)"]),
        ({"training": {"replayBatchesPerFresh": 0.5}},
         ["spec.training", "replayBufferBatches >= 1"]),
        # RLlib's replay names mean something else there: refused with what to set instead.
        ({"training": {"replayProportion": 2.0}},
         ["spec.training.replayProportion", "1/(p-1)", "set replayBatchesPerFresh"]),
        ({"training": {"replayBufferNumSlots": 8}},
         ["spec.training.replayBufferNumSlots", "set replayBufferBatches"]),
        ({"training": {"lrSchedule": [[100, 0.1], [50, 0.01]]}},
         ["spec.training.lrSchedule", "strictly increase"]),
        ({"env": {"numEnvsPerWorker": 0}}, ["spec.env.numEnvsPerWorker", ">= 1"]),
        ({"learner": {"resources": {"limits": {"cpu": "lots"}}}},
         ["spec.learner.resources.limits.cpu", "got 'lots'"]),
    ],
)
def test_errors_name_field_value_and_range(spec: dict, expected: list[str]) -> None:
    problems = _problems(spec)
    assert len(problems) == 1, problems
    for fragment in expected:
        assert fragment in problems[0], (fragment, problems[0])


def test_bad_name_is_rejected_with_the_rule() -> None:
    with pytest.raises(ManifestError) as exc:
        parse_manifest(job_manifest("Bad_Name"))
    assert "metadata.name" in exc.value.problems[0]
    assert "DNS-1035" in exc.value.problems[0]


def test_every_problem_is_reported_at_once() -> None:
    problems = _problems({"training": {"lr": 0, "gamma": 2}, "stop": {"timesteps": 0}})
    assert {p.split(":")[0] for p in problems} == {
        "spec.training.lr", "spec.training.gamma", "spec.stop.timesteps"}


def test_overrides_parse_yaml_values_and_default_to_spec() -> None:
    data = apply_overrides(job_manifest(), ["training.lr=1e-3", "spec.stop.timesteps=100",
                                            "model.hidden=[32, 32]", "metadata.name=renamed"])
    job = parse_manifest(data)
    assert job.spec.training.lr == 1e-3
    assert job.spec.stop.timesteps == 100
    assert job.spec.model.hidden == [32, 32]
    assert job.name == "renamed"


def test_override_without_equals_is_an_error() -> None:
    with pytest.raises(ManifestError, match="KEY=VALUE"):
        apply_overrides(job_manifest(), ["training.lr"])


def test_load_manifest_finds_the_impalajob_among_documents(tmp_path: Path) -> None:
    path = tmp_path / "multi.yaml"
    config_map = {"kind": "ConfigMap", "metadata": {"name": "x"}}
    path.write_text(yaml.safe_dump_all([config_map, job_manifest("j")]))
    assert load_manifest(path).name == "j"
    (tmp_path / "none.yaml").write_text("kind: ConfigMap\n")
    with pytest.raises(ManifestError, match="no document with kind: ImpalaJob"):
        load_manifest(tmp_path / "none.yaml")


def test_replica_bounds_clamp_the_initial_count() -> None:
    job = parse_manifest(job_manifest(rollouts={"minReplicas": 1, "maxReplicas": 3, "replicas": 9}))
    assert job.spec.rollouts.initial_replicas == 3


RLLIB_IMPALA_DEFAULTS: dict[str, object] = {
    # IMPALAConfig.__init__ in ../shared/seeds (and AlgorithmConfig's num_envs_per_env_runner).
    "env.numEnvsPerWorker": 1,
    "training.lr": 0.0005,
    "training.gamma": 0.99,
    "training.trainBatchSize": 500,
    "training.rolloutFragmentLength": 50,
    "training.vtraceClipRhoThreshold": 1.0,
    "training.vtraceClipPgRhoThreshold": 1.0,
    "training.vfLossCoeff": 0.5,
    "training.entropyCoeff": 0.01,
    "training.gradClip": 40.0,
    "training.optimizer.type": "adam",
    "training.optimizer.decay": 0.99,
    "training.optimizer.momentum": 0.0,
    "training.separateVfOptimizer": False,
    "training.lrVf": 0.0005,
    "training.numSgdIter": 1,
    "training.minibatchBufferSize": 1,
    "training.learnerQueueSize": 3,
    "training.learnerQueueTimeout": 300,
    "training.numMultiGpuTowerStacks": 1,
    "training.numGpuLoaderThreads": 8,
    "training.broadcastInterval": 1,
    "training.maxRequestsInFlightPerWorker": 1,
    # RLlib's MODEL_DEFAULTS (rllib/models/catalog.py).
    "model.useLstm": False,
    "model.lstmCellSize": 256,
    "model.maxSeqLen": 20,
    "model.freeLogStd": False,
}


# Our field -> the attribute IMPALAConfig.__init__ sets (the ones the seed's IMPALAConfig holds;
# gamma, numSgdIter and numEnvsPerWorker are AlgorithmConfig's, outside the seed).
SEED_NAMES = {
    "training.lr": "lr",
    "training.trainBatchSize": "train_batch_size",
    "training.rolloutFragmentLength": "rollout_fragment_length",
    "training.vtraceClipRhoThreshold": "vtrace_clip_rho_threshold",
    "training.vtraceClipPgRhoThreshold": "vtrace_clip_pg_rho_threshold",
    "training.vfLossCoeff": "vf_loss_coeff",
    "training.entropyCoeff": "entropy_coeff",
    "training.gradClip": "grad_clip",
    "training.optimizer.type": "opt_type",
    "training.optimizer.decay": "decay",
    "training.optimizer.momentum": "momentum",
    "training.separateVfOptimizer": "_separate_vf_optimizer",
    "training.lrVf": "_lr_vf",
    "training.minibatchBufferSize": "minibatch_buffer_size",
    "training.learnerQueueSize": "learner_queue_size",
    "training.learnerQueueTimeout": "learner_queue_timeout",
    "training.numMultiGpuTowerStacks": "num_multi_gpu_tower_stacks",
    "training.numGpuLoaderThreads": "num_gpu_loader_threads",
    "training.broadcastInterval": "broadcast_interval",
    "training.maxRequestsInFlightPerWorker": "max_requests_in_flight_per_env_runner",
}
SEEDS = Path(__file__).resolve().parents[4] / "shared" / "seeds"


def _seed_impala_defaults() -> dict[str, object]:
    """`self.NAME = LITERAL` assignments of IMPALAConfig.__init__ in RLlib's source (the seed)."""
    import ast
    import re

    text = next(
        (t for f in sorted(SEEDS.glob("*.txt")) if "class IMPALAConfig" in (t := f.read_text())),
        "",
    )
    body = text[text.find("class IMPALAConfig") :]
    body = body[: body.find("def training(")]
    found: dict[str, object] = {}
    literal = r"(-?[\d.]+|True|False|\"\w+\"|None)(?![\w.])"
    for name, raw in re.findall(r"self\.(\w+) = " + literal, body):
        found.setdefault(name, ast.literal_eval(raw))
    return found


def test_the_defaults_table_is_rllibs_source() -> None:
    """RLLIB_IMPALA_DEFAULTS is what RLlib's IMPALAConfig (../shared/seeds) really sets."""
    if not SEEDS.is_dir():
        pytest.skip("RLlib's sources (../shared/seeds) are not beside this checkout")
    seed = _seed_impala_defaults()
    assert len(seed) > 20, "IMPALAConfig.__init__ not found in the seeds"
    for ours, theirs in SEED_NAMES.items():
        assert RLLIB_IMPALA_DEFAULTS[ours] == seed[theirs], (ours, theirs, seed[theirs])
    # The optimiser's epsilon: omitted means RLlib's 0.1 for rmsprop.
    assert seed["epsilon"] == 0.1


def test_defaults_are_rllibs_or_say_why_not() -> None:
    """Every default equals RLlib IMPALA's, or DEFAULTS_APART_FROM_RLLIB gives RLlib's value and
    the reason (the CRD and `kubectl explain` show the same note on the field)."""
    spec = ImpalaJobSpec.model_validate({"stop": {"timesteps": 1}}).model_dump(by_alias=True)
    for path, rllib in RLLIB_IMPALA_DEFAULTS.items():
        ours: Any = spec
        for part in path.split("."):
            ours = ours[part]
        if path in DEFAULTS_APART_FROM_RLLIB:
            documented, why = DEFAULTS_APART_FROM_RLLIB[path]
            assert ours != rllib and documented == rllib and why, path
        else:
            assert ours == rllib, (path, ours, rllib)
    assert set(DEFAULTS_APART_FROM_RLLIB) <= set(RLLIB_IMPALA_DEFAULTS)


def test_storage_uri_and_its_secret() -> None:
    job = parse_manifest(
        job_manifest(checkpoint={"storageUri": "s3://results/runs/cp", "secretRef": {"name": "s3"}})
    )
    assert job.spec.checkpoint.storage_uri == "s3://results/runs/cp"
    ref = job.spec.checkpoint.secret_ref
    assert ref is not None and ref.name == "s3"
    (problem,) = _problems({"checkpoint": {"secretRef": {"name": "s3"}}})
    assert "secretRef" in problem and "set storageUri" in problem
    (problem,) = _problems({"checkpoint": {"storageUri": "gs://results/cp"}})
    assert "checkpoint.storageUri" in problem
    (problem,) = _problems({"checkpoint": {"storageUri": "s3://Results"}})
    assert "checkpoint.storageUri" in problem
