"""Default sampling parameters a checkpoint ships in generation_config.json, applied as vLLM applies
them (its `--generation-config`, default "auto").

The engine option `generation_config` picks the source: "auto" reads the model's own
generation_config.json (a preset has none), "vllm" uses none, any other value is a directory holding
one. Of that file, `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty` and
`max_new_tokens` (as `max_tokens`) become the defaults of a request that leaves them out (server
requests, and `LLM.generate`/`chat` called without SamplingParams); other keys (`do_sample`,
`eos_token_id`, ...) are not read, as vLLM does not read them for sampling.
"""

from __future__ import annotations

import json
import logging
import os

from ..errors import ConfigError

logger = logging.getLogger("rlt")

FILE = "generation_config.json"
SAMPLING_KEYS = {"temperature": float, "top_p": float, "top_k": int, "min_p": float, "repetition_penalty": float,
                 "max_new_tokens": int}
SOURCES = ("auto", "vllm")  # or a directory


def read_generation_defaults(directory: str) -> dict:
    """The sampling defaults of `directory`/generation_config.json ({} without one), as SamplingParams
    field names. A value of the wrong type is left out with a warning; values SamplingParams refuses
    are a ConfigError naming the file."""
    from ..sampling_params import SamplingParams

    path = os.path.join(directory, FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is not readable JSON ({exc}); pass generation_config='vllm' to ignore it") from None
    out = {}
    for key, kind in SAMPLING_KEYS.items():
        value = data.get(key) if isinstance(data, dict) else None
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            logger.warning("%s: %s=%r is not a%s number; not used as a default", path, key, value,
                           "n integer" if kind is int else "")
            continue
        out["max_tokens" if key == "max_new_tokens" else key] = kind(value)
    if out.get("top_k") == 0:  # (Hugging Face's "off")
        out["top_k"] = -1
    try:
        SamplingParams(**out)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}; pass generation_config='vllm' to ignore the file") from None
    if out:
        logger.info("default sampling parameters from %s: %s", path, out)
    return out


def generation_defaults(model: str, cfg) -> dict:
    """The sampling defaults the engine options `cfg` (an EngineConfig: generation_config, revision,
    download_dir) give `model` (see module docstring)."""
    source = cfg.generation_config
    if source == "vllm":
        return {}
    if source == "auto":
        from .checkpoint import resolve_model

        kind, ref = resolve_model(model, revision=cfg.revision, download_dir=cfg.download_dir)
        return {} if kind == "preset" else read_generation_defaults(ref)
    directory = os.path.expanduser(source)
    if not os.path.isfile(os.path.join(directory, FILE)):
        raise ConfigError(f"generation_config must be 'auto' (the model's {FILE}), 'vllm' (no defaults) or a "
                          f"directory holding {FILE}, got {source!r}")
    return read_generation_defaults(directory)
