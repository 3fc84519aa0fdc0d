"""The data-parallel `MultiDeviceLearner`: one model tower per device (RLlib's multi-GPU
towers), a `Learner` whose master tower owns the optimiser."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np
import torch

from impala_trainer.batches import TrainBatch, slice_columns
from impala_trainer.learning.collective import Collective
from impala_trainer.learning.distributions import ActionDistribution
from impala_trainer.learning.learner import (
    Learner,
    LearnerConfig,
    _grads,
    _reusable,
    batch_to_tensors,
)
from impala_trainer.learning.losses import (
    SUMMED_STATS,
    BatchTensors,
    LossCoefficients,
    LossOutput,
    backward,
    impala_loss,
    model_inputs,
)
from impala_trainer.learning.model_factory import build_model
from impala_trainer.learning.models import ActorCritic


class _Shard(NamedTuple):
    """A batch's columns loaded onto one tower's device."""

    tower: int
    tensors: BatchTensors
    inputs: torch.Tensor | None
    """`model_inputs` of the tensors, prepared at load time (None: each pass prepares)."""
    share: float
    """The shard's columns / the batch's columns."""


class MultiDeviceLearner(Learner):
    """Data-parallel learner: one model tower per device, gradients summed into the master.

    Devices are cuda:0..n-1 for learner.gpus, else learner.fakeDevices CPU "devices" (RLlib's
    _fake_gpus), so the whole path runs without a GPU. Tower 0 is the master: it owns the
    optimiser; after each step the other towers copy its parameters.
    """

    def __init__(
        self,
        config: LearnerConfig,
        obs_shape: tuple[int, ...],
        actions: ActionDistribution | int,
        *,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        gpus, fake = config.learner.gpus, config.learner.fake_devices
        names = [f"cuda:{i}" for i in range(gpus)] if gpus > 0 else ["cpu"] * max(1, fake)
        super().__init__(config, obs_shape, actions, names[0], dtype=dtype)
        self.devices = [torch.device(n) for n in names]
        self.towers: list[ActorCritic] = [self.model]
        for device in self.devices[1:]:
            tower = build_model(config.model, tuple(obs_shape), self.dist).to(device, dtype)
            tower.load_state_dict(self.model.state_dict())
            self.towers.append(tower)
        self.num_stacks = config.training.num_multi_gpu_tower_stacks
        # buffer index -> shards (loaded once, each passed over numSgdIter times)
        self._stacks: dict[int, list[_Shard]] = {}
        self._direct: TrainBatch | None = None
        """The batch learn_on_batch loaded into its slot and was told to keep."""
        self._loaded_steps: dict[int, int] = {}
        self._copy_streams = threading.local()
        n = len(self.devices)
        self._pool = ThreadPoolExecutor(n, thread_name_prefix="tower") if n > 1 else None

    def load_batch_into_buffer(self, batch: TrainBatch, buffer_index: int) -> int:
        """Split the batch's columns evenly over the towers and copy each shard to its device.

        Returns the env steps loaded. Shards differ by at most one column; the towers' gradients
        add up to the whole batch's (the loss sums over steps).
        """
        if not 0 <= buffer_index < self.num_stacks and buffer_index != -1:
            raise IndexError(f"buffer_index {buffer_index} outside [0, {self.num_stacks})")
        columns, k = batch.num_columns, len(self.devices)
        bounds = [round(i * columns / k) for i in range(k + 1)]
        shards = []
        for i in range(k):
            start, stop = bounds[i], bounds[i + 1]
            if stop > start:
                tensors, inputs = self._copy_to(slice_columns(batch, start, stop), i)
                shards.append(_Shard(i, tensors, inputs, (stop - start) / columns))
        self._stacks[buffer_index] = shards
        self._loaded_steps[buffer_index] = batch.env_steps
        return batch.env_steps

    def _copy_to(
        self, batch: TrainBatch, tower_index: int
    ) -> tuple[BatchTensors, torch.Tensor | None]:
        """The shard on the tower's device, with its model inputs (None where the model's
        preparation reads parameters: then each pass prepares afresh)."""
        device, tower = self.devices[tower_index], self.towers[tower_index]
        if device.type != "cuda":
            tensors = batch_to_tensors(batch, device)
            return tensors, _reusable(model_inputs(tower, tensors, self.autocast_dtype))
        # Loader threads copy on their own stream so loading overlaps the learner's compute.
        streams: dict[int, torch.cuda.Stream] = self._copy_streams.__dict__.setdefault(
            "by_device", {}
        )
        stream = streams.get(device.index)
        if stream is None:
            stream = streams[device.index] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream):
            tensors = batch_to_tensors(batch, device)
            inputs = _reusable(model_inputs(tower, tensors, self.autocast_dtype))
        stream.synchronize()
        # Consumed on the default stream: keep the allocator from reusing them early.
        for t in (*tensors, *([] if inputs is None else [inputs])):
            t.record_stream(torch.cuda.default_stream(device))
        return tensors, inputs

    def get_num_samples_loaded_into_buffer(self, buffer_index: int) -> int:
        """Env steps of the batch last loaded into `buffer_index`."""
        return self._loaded_steps.get(buffer_index, 0)

    def _tower_loss(self, shard: _Shard, coeffs: LossCoefficients) -> LossOutput:
        tower = self.towers[shard.tower]
        for p in tower.parameters():
            p.grad = None
        out = impala_loss(
            tower, shard.tensors, coeffs, self.dist, self.autocast_dtype, shard.inputs
        )
        backward(tower, out, self.config.training.separate_vf_optimizer)
        return out

    def learn_on_loaded_batch(self, buffer_index: int) -> dict[str, float]:
        """Per-tower gradients in parallel, summed into the master, one step, re-sync.

        The loss is a sum over steps, so the shards' gradients add up to the whole batch's."""
        self.take_change()
        shards = self._stacks[buffer_index]
        coeffs = self.coefficients()
        if self._pool is not None and len(shards) > 1:
            futures = [self._pool.submit(self._tower_loss, shard, coeffs) for shard in shards]
            outs = [f.result() for f in futures]
        else:
            outs = [self._tower_loss(shard, coeffs) for shard in shards]

        master = self.devices[0]
        with torch.no_grad():
            if shards[0].tower == 0:
                grads = _grads(self.params)
                rest = shards[1:]
            else:
                for p in self.params:
                    p.grad = torch.zeros_like(p)
                grads = _grads(self.params)
                rest = shards
            for shard in rest:
                tower_grads = [
                    g.to(master, non_blocking=True)
                    for g in _grads(self.towers[shard.tower].parameters())
                ]
                torch._foreach_add_(grads, tower_grads)
            # Sums add over shards; per-step means are weighted by the shard's share of columns.
            summed = torch.tensor(SUMMED_STATS, device=master)
            weighted = [
                torch.where(summed, out.stats.to(master), out.stats.to(master) * shard.share)
                for out, shard in zip(outs, shards, strict=True)
            ]
            loss_stats = torch.stack(weighted).sum(0)
            moments = None
            if outs[0].target_moments is not None:  # a PopArt head: every tower has one
                moments = torch.stack(
                    [out.target_moments.to(master) * shard.share  # type: ignore[union-attr]
                     for out, shard in zip(outs, shards, strict=True)]
                ).sum(0)  # fmt: skip

        gnorm = self._clip_gradients()
        self._step()
        self._update_popart(moments)
        self._sync_towers()
        return self._stats(loss_stats, gnorm, coeffs)

    def learn_on_batch(self, batch: TrainBatch, keep: bool = False) -> dict[str, float]:
        """Load into a private slot and learn on it (for direct use, not with loader threads);
        with `keep` the next call with the same batch learns on it as loaded."""
        if batch is not self._direct:
            self.load_batch_into_buffer(batch, -1)
        self._direct = batch if keep else None
        return self.learn_on_loaded_batch(-1)

    def _sync_towers(self) -> None:
        with torch.no_grad(), self.lock:
            for tower in self.towers[1:]:
                # Buffers too: a PopArt head's statistics move with every step.
                for dst, src in zip(tower.buffers(), self.model.buffers(), strict=True):
                    dst.copy_(src, non_blocking=True)
                tower_params: list[torch.Tensor] = list(tower.parameters())
                if tower_params[0].device == self.params[0].device:
                    torch._foreach_copy_(tower_params, list[torch.Tensor](self.params))
                else:
                    for dst, src in zip(tower_params, self.params, strict=True):
                        dst.copy_(src, non_blocking=True)

    def set_weights(self, weights: dict[str, np.ndarray]) -> None:
        super().set_weights(weights)
        self._sync_towers()

    def join(self, collective: Collective) -> None:
        super().join(collective)
        self._sync_towers()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._sync_towers()
