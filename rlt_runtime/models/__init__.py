"""Model families, configs, checkpoints and tokenizers."""

from __future__ import annotations

from typing import Iterator

import torch

from .configs import ModelConfig


def load_model(model: str, *, seed: int, device: torch.device, dtype: torch.dtype):
    """Resolve a preset name or checkpoint directory.

    Returns (config, weight iterator of (hf_name, tensor), tokenizer or None). Weights stream to
    `device` in `dtype` one tensor at a time.
    """
    from .checkpoint import iter_checkpoint, load_config, resolve_model
    from .presets import preset_config, preset_weights
    from .tokenizer import builtin_tokenizer, load_tokenizer

    kind, ref = resolve_model(model)
    if kind == "preset":
        config = preset_config(ref)
        weights: Iterator = preset_weights(config, seed=seed, device=device, dtype=dtype)
        tokenizer = builtin_tokenizer(config)
    else:
        config = load_config(ref)
        weights = iter_checkpoint(ref, config, device=device, dtype=dtype)
        tokenizer = load_tokenizer(ref, config)
    return config, weights, tokenizer


def build_model(config: ModelConfig, layout, device, dtype):
    """An empty model of the config's family (call `load_weights` next)."""
    if config.family == "ouro":
        from .ouro import OuroModel

        return OuroModel(config, layout, device, dtype)
    from .huginn import HuginnModel

    return HuginnModel(config, layout, device, dtype)


__all__ = ["ModelConfig", "load_model", "build_model"]
