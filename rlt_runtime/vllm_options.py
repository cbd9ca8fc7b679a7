"""vLLM engine option names users type by habit: mapped to rlt's options, or rejected with an error
that names the vLLM option, the rlt option and the allowed values.

`EngineConfig.from_kwargs` (so `LLM(...)`, `LLMEngine(...)`) and the CLIs' `--enforce-eager`,
`--swap-space`, ... flags go through `translate_vllm_options`. `tokenizer` is not here:
it is an rlt option of its own (a tokenizer directory other than the model's).
"""

from __future__ import annotations

from .errors import ConfigError

VLLM_OPTIONS = ("enforce_eager", "disable_log_stats", "trust_remote_code", "swap_space", "load_format", "tokenizer_mode")
# vLLM values rlt's loading already is (anything else is a ConfigError naming them).
ACCEPTED_VALUES = {"load_format": ("auto", "safetensors"), "tokenizer_mode": ("auto",)}
WHY_NOT = {"load_format": "rlt reads safetensors checkpoints (random weights: a preset, e.g. ouro-1.4b)",
           "tokenizer_mode": "rlt reads the checkpoint's tokenizer.json with the tokenizers library"}


def _bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} (vLLM option) must be a boolean, got {value!r}")
    return value


def translate_vllm_options(kwargs: dict) -> dict:
    """`kwargs` with the vLLM names replaced by rlt options (or dropped where they change nothing).

    Raises ConfigError for a vLLM setting rlt does not support, naming both options.
    """
    out = {k: v for k, v in kwargs.items() if k not in VLLM_OPTIONS}
    if _bool("enforce_eager", kwargs.get("enforce_eager", False)):
        mode = kwargs.get("execution_mode")
        if mode not in (None, "eager"):
            raise ConfigError(f"enforce_eager=True (vLLM option) means execution_mode='eager' but execution_mode="
                              f"{mode!r} was also given; give one of them")
        out["execution_mode"] = "eager"
    _bool("disable_log_stats", kwargs.get("disable_log_stats", False))  # rlt logs no periodic stats
    _bool("trust_remote_code", kwargs.get("trust_remote_code", False))  # rlt never runs checkpoint code
    for name, accepted in ACCEPTED_VALUES.items():
        if name in kwargs and kwargs[name] not in accepted:
            raise ConfigError(f"{name} (vLLM option) must be {' or '.join(map(repr, accepted))} or left out, got "
                              f"{kwargs[name]!r}: {WHY_NOT[name]}")
    swap = kwargs.get("swap_space", 0)
    if not isinstance(swap, (int, float)) or isinstance(swap, bool) or swap != 0:
        raise ConfigError(f"swap_space (vLLM option) must be 0 or left out, got {swap!r}: rlt has no CPU swap budget; "
                          "swap preemption is preemption_mode='swap' (host memory as needed; allowed: 'recompute', "
                          "'swap')")
    if "swap_space" in kwargs:  # swap_space=0: no swapping
        if kwargs.get("preemption_mode", "recompute") != "recompute":
            raise ConfigError(f"swap_space=0 (vLLM option) means no swapping but preemption_mode="
                              f"{kwargs['preemption_mode']!r} was also given; give one of them")
        out["preemption_mode"] = "recompute"
    return out
