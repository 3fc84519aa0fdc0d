"""The models a spec can ask for: the deep ResNet, LSTM cores over every torso, your own class
(`model.type: custom`); and what does not fit refused before anything starts, naming the field
(`impala_trainer.preflight`, run by `impalajob validate`, `train` and the learner pod)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from impala_api.manifest import ManifestError, parse_manifest
from impala_api.spec import ModelSpec
from impala_trainer.batches import concat_fragments
from impala_trainer.learning.learner import Learner, LearnerConfig
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import RecurrentActorCritic, TorsoActorCritic
from impala_trainer.preflight import job_problem
from impala_trainer.rollouts.worker import RolloutWorker
from tests.support.jobs import job_manifest, make_spec

ROOT = Path(__file__).resolve().parents[3]
CORRIDOR = "tests.support.corridor:Corridor-v0"
MODELS = "tests.support.custom_models"


def test_the_deep_resnet_is_the_papers() -> None:
    model = build_model(ModelSpec(type="resnet", hidden=[256]), (4, 84, 84), 6)
    assert isinstance(model, TorsoActorCritic)
    convs = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 15  # 3 stacks x (1 + 2 blocks x 2 convs)
    assert [c.out_channels for c in convs[::5]] == [16, 32, 32]
    assert model.torso.fc[0].in_features == 32 * 11 * 11  # 84 -> 42 -> 21 -> 11
    outputs, values = model(torch.zeros(3, 4, 84, 84, dtype=torch.uint8))
    assert outputs.shape == (3, 6) and values.shape == (3,)


@pytest.mark.parametrize("kind", ["mlp", "cnn", "resnet"])
def test_an_lstm_core_goes_over_every_torso(kind: str) -> None:
    shape = (4,) if kind == "mlp" else (2, 36, 36)
    spec = ModelSpec(type=kind, hidden=[32], useLstm=True, lstmCellSize=16)
    model = build_model(spec, shape, 3)
    assert isinstance(model, RecurrentActorCritic) and model.state_size == 32
    obs = torch.zeros(5, 2, *shape, dtype=torch.uint8 if kind != "mlp" else torch.float32)
    outputs, values, states = model.forward_sequence(
        obs, model.initial_state(2), torch.zeros(5, 2, dtype=torch.bool)
    )
    assert (outputs.shape, values.shape, states.shape) == ((5, 2, 3), (5, 2), (5, 2, 32))


@pytest.mark.parametrize("model", ["TinyActorCritic", "GRUActorCritic"])
def test_a_custom_model_acts_and_learns(model: str) -> None:
    spec = make_spec(
        env={"id": CORRIDOR, "numEnvsPerWorker": 4},
        model={"type": "custom", "import": f"{MODELS}:{model}", "config": {}},
        training={"rolloutFragmentLength": 12},
    )
    assert job_problem(spec) is None
    worker = RolloutWorker(spec, "w", seed=0)
    assert type(worker.policies["default"].model).__name__ == model
    learner = Learner(LearnerConfig.of(spec), worker.models["default"].obs_shape,
                      worker.models["default"].actions)  # fmt: skip
    before = {k: v.copy() for k, v in learner.get_weights().items()}
    stats = learner.learn_on_batch(concat_fragments([worker.sample(), worker.sample()]))
    assert np.isfinite(stats["total_loss"])
    assert any(not np.array_equal(before[k], v) for k, v in learner.get_weights().items())


def _problem(**spec: Any) -> tuple[str, str] | None:
    return job_problem(make_spec(env={"id": CORRIDOR}, **spec))


@pytest.mark.parametrize(
    ("model", "training", "field", "says"),
    [
        ({"import": "nosuch_pkg.models:Net"}, {}, "model.import",
         "cannot import module 'nosuch_pkg.models': ModuleNotFoundError"),
        ({"import": f"{MODELS}:Missing"}, {}, "model.import", "has no 'Missing'"),
        ({"import": f"{MODELS}:NotAModel"}, {}, "model.import",
         "must be a subclass of impala_trainer.learning.models.ActorCritic"),
        ({"import": f"{MODELS}:TinyActorCritic", "config": {"widht": 8}}, {}, "model.config",
         "unexpected keyword argument 'widht'"),
        ({"import": f"{MODELS}:WrongOutputs"}, {}, "model.import",
         "WrongOutputs breaks the model interface: outputs for 2 observations have shape (2, 3), "
         "not (2, 2)"),
        ({"import": f"{MODELS}:NoValueHead"}, {"separateVfOptimizer": True}, "model.import",
         "define value_function_parameters()"),
    ],
    ids=["module", "name", "not-a-model", "config", "outputs", "value-parameters"],
)  # fmt: skip
def test_a_custom_model_that_does_not_fit_is_refused_naming_the_field(
    model: dict[str, Any], training: dict[str, Any], field: str, says: str
) -> None:
    problem = _problem(model={"type": "custom", **model}, training=training)
    assert problem is not None and problem[0] == field and says in problem[1], problem


def test_built_in_models_that_do_not_fit_the_spaces_are_refused() -> None:
    assert _problem(model={"type": "resnet"}) == (
        "model.type",
        f"type resnet needs [C, H, W] image observations; {CORRIDOR} observes (6,): use mlp "
        "(or auto)",
    )
    field, why = _problem(model={"freeLogStd": True}) or ("", "")
    assert field == "model.freeLogStd"
    assert why == "freeLogStd needs a Box action space, not Discrete(2)"
    assert _problem(model={"type": "custom", "import": f"{MODELS}:NoValueHead"}) is None


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"model": {"type": "custom"}}, "spec.model.type custom needs spec.model.import"),
        ({"model": {"import": f"{MODELS}:TinyActorCritic"}}, "is only read with type custom"),
        ({"model": {"type": "custom", "import": f"{MODELS}:GRUActorCritic", "useLstm": True}},
         "spec.model.useLstm wraps the built-in networks"),
        ({"model": {"maxSeqLen": 7}, "training": {"rolloutFragmentLength": 20}},
         "spec.model.maxSeqLen must divide spec.training.rolloutFragmentLength"),
    ],
    ids=["custom-no-import", "import-not-custom", "custom-lstm", "seq-len"],
)  # fmt: skip
def test_the_manifest_refuses_model_fields_that_contradict(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(ManifestError, match="spec") as err:
        parse_manifest(job_manifest("m", spec))
    assert says in str(err.value)


def test_validate_exits_2_naming_the_model_field(tmp_path: Path) -> None:
    manifest = tmp_path / "job.yaml"
    model = {"type": "custom", "import": f"{MODELS}:WrongOutputs"}
    manifest.write_text(yaml.safe_dump(job_manifest("mine", env={"id": CORRIDOR}, model=model)))
    res = subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "validate", "-f", str(manifest)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "spec.model.import: WrongOutputs breaks the model interface" in res.stderr
