"""The learner's compute precision: `learner.precision` resolved against the device it runs on.

bfloat16 autocast pays only where the hardware computes bf16 natively. Measured for the Pong CNN's
forward and backward over 275 frames on one thread (torch 2.x, timed alone): 64 ms in
float32 against 44-47 ms under bf16 autocast on an AMD EPYC with AVX512-BF16, but 112 against
158 ms on an Intel Xeon without it (oneDNN then converts in software). So `auto` looks at the
CPU's flags, or asks CUDA, and falls back to float32.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

# CPU flags (as /proc/cpuinfo spells them) under which oneDNN runs bf16 matmuls and convolutions
# in hardware: AVX512-BF16 (Cooper Lake, Zen 4 and later) and AMX (Sapphire Rapids and later).
NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags; empty where /proc/cpuinfo is absent (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(device: torch.device, flags: Iterable[str] | None = None) -> bool:
    """Whether `device` computes bfloat16 in hardware (`flags`: the CPU's, read when None)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        return not NATIVE_BF16_CPU_FLAGS.isdisjoint(cpu_flags() if flags is None else flags)
    return False


def autocast_dtype(
    precision: str, device: torch.device, flags: Iterable[str] | None = None
) -> torch.dtype | None:
    """The autocast dtype for `learner.precision` on `device`; None for plain float32."""
    if precision == "float32":
        return None
    if precision == "bfloat16":
        return torch.bfloat16
    if precision == "auto":
        return torch.bfloat16 if native_bf16(device, flags) else None
    raise ValueError(f"learner.precision: unknown value {precision!r}")


def acting_dtype(precision: str, flags: Iterable[str] | None = None) -> torch.dtype | None:
    """The dtype a rollout worker acts in on this CPU (`flags`: its flags, read when None):
    bfloat16 where the learner computes in bf16 (`learner.precision` not float32) and this CPU
    computes it natively, else None (float32).

    The learner may run elsewhere (a GPU, another node), so each worker decides from its own
    CPU; on one without bf16 in hardware a bf16 forward would be slower than float32.
    """
    if precision == "float32" or not native_bf16(torch.device("cpu"), flags):
        return None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager[object]:
    """torch.autocast for `dtype` on `device`'s type, or nothing for float32."""
    if dtype is None:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)
