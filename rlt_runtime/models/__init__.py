"""Model families, configs, checkpoints and tokenizers."""

from __future__ import annotations

import os
from typing import Iterator, Optional

import torch

from .configs import ModelConfig


def load_model(model: str, *, seed: int, device: torch.device, dtype: torch.dtype, tokenizer: Optional[str] = None,
               revision: Optional[str] = None, download_dir: Optional[str] = None):
    """Resolve a preset name, checkpoint directory or Hugging Face Hub name (`namespace/name` at
    `revision`, from the cache in `download_dir` or the default one; see models/hub.py).

    Returns (config, weight iterator of (hf_name, tensor), tokenizer or None). Weights stream to
    `device` in `dtype` one tensor at a time. `tokenizer`: a directory or Hub name (its main
    revision) whose tokenizer.json replaces the model's own tokenizer (its ids must lie
    in the model's vocabulary). No code from a checkpoint is ever imported or run.
    """
    from .checkpoint import iter_checkpoint, load_config, resolve_model
    from .presets import preset_config, preset_weights
    from .tokenizer import builtin_tokenizer, load_tokenizer

    kind, ref = resolve_model(model, revision=revision, download_dir=download_dir)
    if kind == "preset":
        config = preset_config(ref)
        weights: Iterator = preset_weights(config, seed=seed, device=device, dtype=dtype)
    else:
        config = load_config(ref)
        weights = iter_checkpoint(ref, config, device=device, dtype=dtype)
    if tokenizer is not None:
        tok = _other_tokenizer(tokenizer, config, download_dir)
    else:
        tok = builtin_tokenizer(config) if kind == "preset" else load_tokenizer(ref, config)
    return config, weights, tok


def _other_tokenizer(name: str, config: ModelConfig, download_dir: Optional[str]):
    """The tokenizer of the `tokenizer` option: tokenizer.json in the directory or Hub repo `name`."""
    from ..errors import CheckpointError, ConfigError
    from .hub import looks_like_repo_id, resolve_repo
    from .tokenizer import load_tokenizer

    directory = os.path.expanduser(name)
    if not os.path.isdir(directory) and looks_like_repo_id(name):
        try:
            directory = resolve_repo(name, download_dir=download_dir, what="tokenizer")
        except CheckpointError as exc:
            raise ConfigError(f"tokenizer {name!r} is not a directory, and as a Hugging Face Hub name: {exc}") from None
    if not os.path.isdir(directory) or not os.path.isfile(os.path.join(directory, "tokenizer.json")):
        raise ConfigError(f"tokenizer must be a directory holding tokenizer.json or a Hugging Face Hub name, "
                          f"got {name!r}")
    tok = load_tokenizer(directory, config)
    if tok.vocab_size > config.vocab_size:
        raise ConfigError(f"tokenizer {name!r} has {tok.vocab_size} tokens but the model's vocabulary has "
                          f"{config.vocab_size}; the tokenizer's ids must lie in the model's vocabulary")
    return tok


def build_model(config: ModelConfig, layout, device, dtype, quantization: Optional[str] = None):
    """An empty model of the config's family (call `load_weights` next); quantization None or
    "fp8" (the layers' linear weights stored as FP8, see models/fp8_weights.py)."""
    if config.family == "ouro":
        from .ouro import OuroModel

        return OuroModel(config, layout, device, dtype, quantization)
    from .huginn import HuginnModel

    return HuginnModel(config, layout, device, dtype, quantization)


__all__ = ["ModelConfig", "load_model", "build_model"]
