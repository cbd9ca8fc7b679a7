"""New weights for a loaded model, written in place (`LLM.update_weights`, e.g. after a training step).

Any set of a checkpoint's tensors, by their Hugging Face names: the whole state dict or a few of
its tensors. Each model family maps every name to its `Target`s (`weight_targets()`): where the
tensor lives once q/k/v and gate/up are fused and a tensor-parallel rank's shard is cut. A tensor
is converted as the loader converts it (the model dtype; FP8 quantized per output row, so rows
written alone take the scales a whole load gives them) and copied into the live tensors: they
keep their storage, so CUDA graphs and compiled programs, which captured those addresses, read
the new values. The result is, bit for bit, the model a load of the updated checkpoint builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from rlt_kernels.fp8 import quantize_weight_fp8

from ..errors import CheckpointError, ConfigError
from .configs import OPTIONAL_EXTRA_TENSORS, hf_weight_shapes
from .fp8_weights import Fp8Weight


@dataclass(frozen=True, eq=False)
class Target:
    """One place a checkpoint tensor goes. dst: the live weight (a tensor or an `Fp8Weight`); the
    tensor, after `pick` (a view of it, e.g. one half of Huginn's q/k bias), is cut to its `rows` or
    `cols` ([start, stop): this rank's part; None keeps all) and written from row `at` of dst."""

    dst: object
    rows: Optional[tuple[int, int]] = None
    cols: Optional[tuple[int, int]] = None
    at: int = 0
    pick: Optional[Callable[[torch.Tensor], torch.Tensor]] = None


def write_weights(model, weights) -> int:
    """Write (hf_name, tensor) pairs, any subset of the model's checkpoint names in any dtype and
    device, into `model` in place; returns the bytes written. Every name and shape is checked
    before anything is written (CheckpointError naming the tensor): a refused set changes nothing."""
    cfg = model.config
    expected = hf_weight_shapes(cfg)
    extras = OPTIONAL_EXTRA_TENSORS[cfg.family]  # (tensors a checkpoint may carry that the loader drops)
    given: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if name in extras:
            continue
        if name not in expected:
            raise CheckpointError(f"update_weights: unexpected tensor {name!r} (not in a {cfg.family} checkpoint)")
        if name in given:
            raise CheckpointError(f"update_weights: tensor {name!r} is given twice")
        if tuple(tensor.shape) != tuple(expected[name]):
            raise CheckpointError(f"update_weights: tensor {name!r} has shape {list(tensor.shape)}, "
                                  f"expected {list(expected[name])}")
        given[name] = tensor
    targets = model.weight_targets()
    written = 0
    for name, tensor in given.items():
        t = tensor.detach().to("cpu", model.dtype)  # (as the loader rounds it; quantized on the host)
        for target in targets[name]:
            written += _write(target, t, name)
    return written


def _write(target: Target, t: torch.Tensor, name: str) -> int:
    """Write checkpoint tensor `t` (host, model dtype) through `target`; returns the bytes written."""
    if target.pick is not None:
        t = target.pick(t)
    if target.rows is not None:
        t = t[slice(*target.rows)]
    cols = slice(*target.cols) if target.cols is not None else slice(None)
    if isinstance(target.dst, Fp8Weight):
        data, scale = quantize_weight_fp8(t)  # whole rows: a row's scale is its whole row's
        return _copy(target.dst.data, data[:, cols], target.at, name) + _copy(target.dst.scale, scale, target.at, name)
    return _copy(target.dst, t[:, cols] if target.cols is not None else t, target.at, name)


def _copy(dst: torch.Tensor, src: torch.Tensor, at: int, name: str) -> int:
    """dst[at : at + len(src)] = src (cast to dst's dtype and device); ConfigError if they do not fit."""
    rows = src.shape[0] if src.dim() else 0
    part = dst.narrow(0, at, rows) if dst.dim() and at + rows <= dst.shape[0] else dst
    if part.shape != src.shape:
        raise ConfigError(f"update_weights: {name} gives {list(src.shape)} at row {at}, the loaded model holds "
                          f"{list(dst.shape)}")
    part.copy_(src)
    return part.numel() * part.element_size()
