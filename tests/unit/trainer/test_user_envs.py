"""A user's own environment: `env.id: "module:Env-vN"` imports the module wherever the env is
made, `env.wrappers` wraps each sub-env in the user's classes, and what cannot be imported is
refused before anything starts, naming the field, the module and why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from impala_api.spec import EnvSpec
from impala_trainer.rollouts.envs import env_problem, make_vector_env
from tests.support.jobs import job_manifest

ROOT = Path(__file__).resolve().parents[3]
CORRIDOR = "tests.support.corridor:Corridor-v0"
SCALE = "tests.support.corridor:RewardScale"


def _validate(tmp_path: Path, env: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """`impalajob validate` as a user runs it, their package on PYTHONPATH."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job_manifest("mine", env=env)))
    return subprocess.run(
        [sys.executable, "-m", "impala_cli.main", "validate", "-f", str(manifest)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def test_a_module_id_and_wrappers_validate(tmp_path: Path) -> None:
    res = _validate(tmp_path, {"id": CORRIDOR, "wrappers": [{"import": SCALE}]})
    assert res.returncode == 0, res.stderr
    assert "ImpalaJob mine is valid" in res.stdout


@pytest.mark.parametrize(
    ("env", "field", "says"),
    [
        (
            {"id": "nosuch_pkg.envs:Corridor-v0"},
            "spec.env.id",
            "cannot import module 'nosuch_pkg.envs': ModuleNotFoundError",
        ),
        ({"id": "tests.support.corridor:Corridor-v7"}, "spec.env.id", "Corridor"),
        (
            {"id": CORRIDOR, "wrappers": [{"import": SCALE}, {"import": "nosuch_pkg:Wrap"}]},
            "spec.env.wrappers[1].import",
            "cannot import module 'nosuch_pkg'",
        ),
        (
            {"id": CORRIDOR, "wrappers": [{"import": "tests.support.corridor:Missing"}]},
            "spec.env.wrappers[0].import",
            "has no 'Missing'",
        ),
        (
            {"id": CORRIDOR, "wrappers": [{"import": "tests.support.corridor:NotAWrapper"}]},
            "spec.env.wrappers[0].import",
            "is not a class or callable",
        ),
        (
            {"id": "tests.support.corridor:TupleCorridor-v0"},
            "spec.env.id",
            "action space Tuple(Discrete(2), Discrete(2)) is not supported",
        ),
        (
            {"id": CORRIDOR, "wrappers": [{"import": "tests.support.corridor:ShiftActions"}]},
            "spec.env.id",
            "action space Discrete(2, start=1) does not start at 0",
        ),
        (
            {"id": CORRIDOR, "kwargs": {"lenght": 4}},
            "spec.env.kwargs",
            "making tests.support.corridor:Corridor-v0 failed: TypeError",
        ),
    ],
    ids=[
        "module",
        "version",
        "wrapper-module",
        "wrapper-name",
        "wrapper-not-callable",
        "tuple-actions",
        "shifted-actions",
        "bad-kwargs",
    ],
)
def test_what_cannot_be_imported_is_refused_naming_the_field(
    tmp_path: Path, env: dict[str, Any], field: str, says: str
) -> None:
    res = _validate(tmp_path, env)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert f"{field}: " in res.stderr and says in res.stderr, res.stderr
    assert "is valid" not in res.stdout


def test_the_module_is_imported_where_the_env_is_made() -> None:
    sys.modules.pop("tests.support.corridor", None)
    env = EnvSpec.model_validate({"id": CORRIDOR, "numEnvsPerWorker": 2})
    assert env_problem(env) is None  # imported it, and the id is registered
    vec = make_vector_env(env, 2, seed=0)
    try:
        obs, _ = vec.reset(seed=0)
        assert obs.shape == (2, 6) and (obs[:, 0] == 1.0).all()
    finally:
        vec.close()


def test_wrappers_wrap_each_sub_env_in_order() -> None:
    env = EnvSpec.model_validate(
        {
            "id": CORRIDOR,
            "wrappers": [
                {"import": SCALE, "kwargs": {"scale": 3.0}},
                {"import": "tests.support.corridor.RewardScale", "kwargs": {"scale": 2.0}},
            ],
        }
    )
    vec = make_vector_env(env, 2, seed=0)
    try:
        _, rewards, *_ = vec.step(np.array([1, 0]))
        np.testing.assert_allclose(rewards, [-0.06, -0.06], rtol=1e-6)  # -0.01 x 3 x 2
        inner = vec.envs[0]
        assert [type(inner).__name__, type(inner.env).__name__] == ["RewardScale", "RewardScale"]
        assert (inner.scale, inner.env.scale) == (2.0, 3.0)  # the first listed is innermost
    finally:
        vec.close()


def test_dict_and_discrete_observations_are_flattened_as_rllibs_preprocessor_does() -> None:
    env = EnvSpec.model_validate({"id": "tests.support.corridor:DictCorridor-v0"})
    vec = make_vector_env(env, 2, seed=0)
    try:
        obs, _ = vec.reset(seed=0)
        # Dict parts in key order: `cell` one-hot over 6 cells, then `left`.
        assert obs.dtype == np.float32  # not gymnasium's float64 for mixed parts
        np.testing.assert_array_equal(obs[0], [1, 0, 0, 0, 0, 0, 1])
        obs, *_ = vec.step(np.array([1, 1]))
        np.testing.assert_allclose(obs[0], [0, 1, 0, 0, 0, 0, 0.8], rtol=1e-6)
        assert vec.single_observation_space.shape == (7,)
    finally:
        vec.close()


def test_an_unsupported_observation_space_is_named() -> None:
    import gymnasium as gym

    from impala_trainer.rollouts.envs import UnsupportedSpaceError, check_spaces

    with pytest.raises(UnsupportedSpaceError, match="observation space Text"):
        check_spaces(gym.spaces.Dict({"note": gym.spaces.Text(8)}), gym.spaces.Discrete(2))
    check_spaces(gym.spaces.Tuple((gym.spaces.MultiBinary(3),)), gym.spaces.Discrete(2))
