"""New weights for a loaded model, written in place (`LLM.update_weights`, e.g. after a training step).

The new weights are loaded as a checkpoint's are, into a second model of the same form on the host
(q/k/v and gate/up fused, FP8 quantized at load, a tensor-parallel rank's shard cut, as a rank
loads), then every tensor is copied into the live model's: the live tensors keep their storage, so CUDA graphs and compiled
programs, which captured those addresses, read the new values.
"""

from __future__ import annotations

import dataclasses

import torch

from ..errors import CheckpointError, ConfigError
from .fp8_weights import Fp8Weight

KEPT = ("config", "layout", "tp", "device", "dtype", "quantization")  # model attributes that are not weights


def checked(weights, expected: dict[str, tuple]):
    """`weights` ((hf_name, tensor) pairs), each tensor's shape checked against `expected`
    (`hf_weight_shapes`: CheckpointError naming the weight); unknown names pass to the loader,
    which names them."""
    for name, tensor in weights:
        want = expected.get(name)
        if want is not None and tuple(tensor.shape) != tuple(want):
            raise CheckpointError(f"update_weights: tensor {name!r} has shape {list(tensor.shape)}, expected {list(want)}")
        yield name, tensor


def copy_weights(live, fresh) -> int:
    """Copy every weight of `fresh` into the same weight of `live` (models of one form, fresh
    possibly on another device); returns the bytes written. ConfigError when the forms differ."""
    written = 0

    def copy(dst, src, where: str) -> None:
        nonlocal written
        if isinstance(dst, torch.Tensor):
            if not isinstance(src, torch.Tensor) or src.shape != dst.shape or src.dtype != dst.dtype:
                raise ConfigError(f"update_weights: {where} is {_form(src)}, the loaded model holds {_form(dst)}")
            dst.copy_(src)
            written += dst.numel() * dst.element_size()
        elif isinstance(dst, Fp8Weight):
            if not isinstance(src, Fp8Weight):
                raise ConfigError(f"update_weights: {where} is {_form(src)}, the loaded model holds FP8 weights")
            copy(dst.data, src.data, f"{where}.data")
            copy(dst.scale, src.scale, f"{where}.scale")
        elif isinstance(dst, (list, tuple)):
            if len(src) != len(dst):
                raise ConfigError(f"update_weights: {where} has {len(src)} entries, the loaded model {len(dst)}")
            for i, (d, s) in enumerate(zip(dst, src)):
                copy(d, s, f"{where}[{i}]")
        elif isinstance(dst, dict):
            for key in dst:
                copy(dst[key], src[key], f"{where}[{key!r}]")
        elif dataclasses.is_dataclass(dst) and not isinstance(dst, type):
            for f in dataclasses.fields(dst):
                copy(getattr(dst, f.name), getattr(src, f.name), f"{where}.{f.name}")

    given = vars(fresh)
    for name, value in vars(live).items():
        if name not in KEPT and name in given:  # (attributes added after loading are not weights)
            copy(value, given[name], name)
    return written


def _form(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}"
    return type(value).__name__
