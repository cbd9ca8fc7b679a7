"""Model configurations for the looped families, parsed strictly from Hugging Face config.json.

`OuroConfig` (model_type "ouro") and `HuginnConfig` (model_type "huginn_raven") carry the
fields of reference/MODELS.md §1.2 / §2.1 plus a few derived properties shared by the
runtime (`family`, `num_loops`, `max_loops`, `kv_heads`, ...). Each field's type and range is
checked on construction (config_fields.py PARSED tables), then the rules between fields (head
divisibility, head width). `config_from_dict` parses those fields, checks token ids against the
vocabulary, and treats every other config.json field as config_fields.py says: math fields must
hold a value rlt implements, checked fields must agree, no-math fields are ignored, unknown
fields are refused. `hf_weight_shapes` lists every tensor a checkpoint must contain, with its
shape, in the checkpoint's own names.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

from ..errors import CheckpointError, ConfigError
from . import config_fields


@dataclass(frozen=True)
class OuroConfig:
    """Ouro: `num_hidden_layers` layers looped `total_ut_steps` times (sandwich norms, exit gate)."""

    vocab_size: int = 49152
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 65536
    rms_norm_eps: float = 1e-6
    total_ut_steps: int = 4
    bos_token_id: int = 0
    eos_token_id: Union[int, list] = 0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False

    family: ClassVar[str] = "ouro"
    model_type: ClassVar[str] = "ouro"
    max_supported_loops: ClassVar[int] = config_fields.OURO_MAX_LOOPS
    context_field: ClassVar[str] = "max_position_embeddings"

    def __post_init__(self):
        _check_fields(self)
        _check_heads(self.num_attention_heads, self.num_key_value_heads)
        if self.tie_word_embeddings is not False:
            raise ConfigError(f"tie_word_embeddings must be false for Ouro (the checkpoints untie lm_head), "
                              f"got {self.tie_word_embeddings!r}")

    @property
    def num_loops(self) -> int:
        return self.total_ut_steps

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def max_model_len(self) -> int:
        return self.max_position_embeddings

    @property
    def norm_eps(self) -> float:
        return self.rms_norm_eps

    @property
    def eos_token_ids(self) -> tuple:
        return tuple(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else (self.eos_token_id,)

    # The type and range of each dataclass field, then config.json fields beyond them (config_fields.py).
    PARSED: ClassVar[dict] = config_fields.OURO_PARSED
    ALIASES: ClassVar[dict] = {}
    MATH_FIELDS: ClassVar[dict] = config_fields.OURO_MATH
    CHECKED_FIELDS: ClassVar[dict] = config_fields.OURO_CHECKED
    NO_MATH_FIELDS: ClassVar[dict] = config_fields.OURO_NO_MATH


@dataclass(frozen=True)
class HuginnConfig:
    """Huginn-0125: prelude blocks, a core block looped `mean_recurrence` times, coda blocks."""

    vocab_size: int = 65536
    n_embd: int = 5280
    n_heads: int = 55
    num_key_value_heads: int = 55
    intermediate_size: int = 17920
    n_layers_in_prelude: int = 2
    n_layers_in_recurrent_block: int = 4
    n_layers_in_coda: int = 2
    mean_recurrence: int = 32
    block_size: int = 4096
    rope_base: float = 50000.0
    norm_eps: float = 1e-6
    qk_bias: bool = True
    bias: bool = False
    tie_embeddings: bool = True
    init_scale: float = 1.0
    bos_token_id: int = 65504
    eos_token_id: Union[int, list] = field(default_factory=lambda: [65505, 65508])
    pad_token_id: int = 65509

    family: ClassVar[str] = "huginn"
    model_type: ClassVar[str] = "huginn_raven"
    max_supported_loops: ClassVar[int] = config_fields.HUGINN_MAX_LOOPS
    context_field: ClassVar[str] = "block_size"

    def __post_init__(self):
        _check_fields(self)
        if self.n_embd % self.n_heads:
            raise ConfigError(f"n_embd ({self.n_embd}) must be divisible by n_heads ({self.n_heads})")
        _check_heads(self.n_heads, self.num_key_value_heads)
        if self.head_dim % 2 or self.head_dim > config_fields.MAX_HEAD_DIM:
            raise ConfigError(f"the head width n_embd / n_heads ({self.n_embd} / {self.n_heads} = {self.head_dim}) "
                              f"must be even (RoPE) and at most {config_fields.MAX_HEAD_DIM} (the attention kernels)")
        if self.bias is not False:
            raise ConfigError(f"bias must be false (rlt implements Huginn-0125's biases: q/k only), got {self.bias!r}")
        if self.tie_embeddings is not True:
            raise ConfigError(f"tie_embeddings must be true for Huginn (lm_head is the embedding), "
                              f"got {self.tie_embeddings!r}")

    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_heads(self) -> int:
        return self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_heads

    @property
    def num_loops(self) -> int:
        return self.mean_recurrence

    @property
    def max_model_len(self) -> int:
        return self.block_size

    @property
    def rope_theta(self) -> float:
        return self.rope_base

    @property
    def embed_scale(self) -> float:
        return math.sqrt(self.n_embd)

    @property
    def init_std(self) -> float:
        """Takase std sqrt(2 / (5 h)) (MODELS.md §2.8)."""
        return math.sqrt(2.0 / (5.0 * self.n_embd))

    @property
    def out_proj_std(self) -> float:
        """std / sqrt(2 * effective depth), effective depth = prelude + coda + core * recurrence."""
        depth = self.n_layers_in_prelude + self.n_layers_in_coda + self.n_layers_in_recurrent_block * self.mean_recurrence
        return self.init_std / math.sqrt(2.0 * depth)

    @property
    def eos_token_ids(self) -> tuple:
        return tuple(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else (self.eos_token_id,)

    # The type and range of each dataclass field, then config.json fields beyond them (config_fields.py).
    PARSED: ClassVar[dict] = config_fields.HUGINN_PARSED
    ALIASES: ClassVar[dict] = config_fields.HUGINN_ALIASES
    MATH_FIELDS: ClassVar[dict] = config_fields.HUGINN_MATH
    CHECKED_FIELDS: ClassVar[dict] = config_fields.HUGINN_CHECKED
    NO_MATH_FIELDS: ClassVar[dict] = config_fields.HUGINN_NO_MATH


ModelConfig = Union[OuroConfig, HuginnConfig]
CONFIG_CLASSES: dict[str, Any] = {"ouro": OuroConfig, "huginn_raven": HuginnConfig}


def _check_fields(cfg) -> None:
    """Each field's type and range (config_fields.py), in declaration order; ConfigError names the field."""
    for f in dataclasses.fields(cfg):
        cfg.PARSED[f.name].check(f.name, getattr(cfg, f.name))


def _check_heads(heads: int, kv_heads: int):
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})")


def config_from_dict(data: dict, source: str = "config.json") -> ModelConfig:
    """Build a config from a parsed config.json (field rules: config_fields.py).

    Parsed fields go to the dataclass (each of its type and range; token ids below vocab_size); a
    math field must hold a value rlt implements, a checked field must agree with the parsed ones,
    a no-math field is ignored; any other field is refused. Every error is a ConfigError naming
    `source`, the field and the values allowed.
    """
    model_type = data.get("model_type")
    if model_type not in CONFIG_CLASSES:
        raise ConfigError(f"{source}: model_type must be one of {sorted(CONFIG_CLASSES)}, got {model_type!r}")
    cls = CONFIG_CLASSES[model_type]
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key == "model_type" or key in cls.CHECKED_FIELDS:
            continue
        if key in names or key in cls.ALIASES:
            target = cls.ALIASES.get(key, key)
            if target != key:  # named as spelled in the file; both spellings present must agree (below)
                _check_field(cls.PARSED[target], key, value, source)
                if target in data:
                    continue
            kwargs[target] = value
        elif key in cls.MATH_FIELDS:
            rule = cls.MATH_FIELDS[key]
            if not rule.accepts(value):
                raise ConfigError(f"{source}: field {key!r} = {value!r} is not supported for model_type "
                                  f"{model_type!r}: rlt implements {rule.describe()} ({rule.meaning})")
        elif key not in cls.NO_MATH_FIELDS:
            raise ConfigError(f"{source}: unsupported field {key!r} for model_type {model_type!r} "
                              f"(not a field rlt knows; it might change the outputs)")
    if cls is OuroConfig and "head_dim" not in kwargs:  # HF Ouro's default: hidden_size / heads
        _derive_ouro_head_dim(kwargs, source)
    try:
        cfg = cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    _check_token_ids(cfg, source)
    for alias, target in cls.ALIASES.items():
        if alias in data and target in data and not config_fields.same_value(data[alias], data[target]):
            raise ConfigError(f"{source}: field {alias!r} = {data[alias]!r} must equal {target} ({data[target]!r})")
    _check_derived(cfg, data, source)
    return cfg


def _check_field(rule: config_fields.ParsedField, name: str, value, source: str) -> None:
    try:
        rule.check(name, value)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _derive_ouro_head_dim(kwargs: dict, source: str) -> None:
    """Set kwargs["head_dim"] = hidden_size // num_attention_heads (HF Ouro's default) once both are valid."""
    hidden = kwargs.get("hidden_size", OuroConfig.hidden_size)
    heads = kwargs.get("num_attention_heads", OuroConfig.num_attention_heads)
    for name, value in (("hidden_size", hidden), ("num_attention_heads", heads)):
        _check_field(OuroConfig.PARSED[name], name, value, source)
    rule = OuroConfig.PARSED["head_dim"]
    if not rule.accepts(hidden // heads):
        raise ConfigError(f"{source}: field 'head_dim' is absent, so it is hidden_size // num_attention_heads "
                          f"({hidden} // {heads} = {hidden // heads}), which must be {rule.describe()} "
                          f"({rule.meaning}); give head_dim or other sizes")
    kwargs["head_dim"] = hidden // heads


def _check_token_ids(cfg: ModelConfig, source: str) -> None:
    """Token ids of the config must lie in its vocabulary."""
    for name, rule in cfg.PARSED.items():
        if rule.kind not in ("token_id", "token_ids"):
            continue
        value = getattr(cfg, name)
        if any(i >= cfg.vocab_size for i in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"{source}: field {name!r} = {config_fields.shown(value)} must be {rule.describe()} "
                              f"with vocab_size = {cfg.vocab_size} ({rule.meaning})")


def _check_derived(cfg: ModelConfig, data: dict, source: str) -> None:
    """Check the CHECKED_FIELDS present in `data` against the values rlt computes from `cfg`."""
    def require(key, ok, expected):
        if not ok:
            raise ConfigError(f"{source}: field {key!r} = {data[key]!r} must be {expected} "
                              f"({cfg.CHECKED_FIELDS[key]})")

    if cfg.family == "ouro":
        if "layer_types" in data:
            value = data["layer_types"]
            require("layer_types", isinstance(value, list) and len(value) == cfg.num_hidden_layers
                    and all(t == "full_attention" for t in value),
                    f"['full_attention'] * {cfg.num_hidden_layers}: rlt implements full causal attention only")
        return
    depth = cfg.n_layers_in_prelude + cfg.n_layers_in_recurrent_block + cfg.n_layers_in_coda
    expected = {"head_dim": cfg.head_dim, "n_layers": depth, "num_hidden_layers": depth,
                "padded_vocab_size": cfg.vocab_size, "tie_word_embeddings": cfg.tie_embeddings}
    for key, value in expected.items():
        if key in data:
            require(key, config_fields.same_value(data[key], value), repr(value))
    if "init_values" in data:
        values, known = data["init_values"], ("std", "embed_scale", "embedding", "out_proj")
        derived = {"std": cfg.init_std, "embed_scale": cfg.embed_scale}
        require("init_values", isinstance(values, dict) and set(values) <= set(known) and all(
            isinstance(values.get(k), (int, float)) and not isinstance(values.get(k), bool)
            and math.isclose(values[k], v, rel_tol=1e-12) for k, v in derived.items()),
            f"an object with keys among {list(known)}, std = {cfg.init_std!r} and embed_scale = {cfg.embed_scale!r}")


def config_to_dict(cfg: ModelConfig) -> dict:
    """The config.json dict a checkpoint writer stores (round-trips through config_from_dict)."""
    data = dataclasses.asdict(cfg)
    data["model_type"] = cfg.model_type
    data["architectures"] = ["OuroForCausalLM"] if cfg.family == "ouro" else ["RavenForCausalLM"]
    return data


def hf_weight_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """Every tensor of a checkpoint in its Hugging Face name, with its shape (MODELS.md §1.6/§2.7)."""
    if cfg.family == "ouro":
        h, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        shapes = {"model.embed_tokens.weight": (v, h)}
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes.update({
                p + "self_attn.q_proj.weight": (q, h),
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "mlp.gate_proj.weight": (f, h),
                p + "mlp.up_proj.weight": (f, h),
                p + "mlp.down_proj.weight": (h, f),
                p + "input_layernorm.weight": (h,),
                p + "input_layernorm_2.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "post_attention_layernorm_2.weight": (h,),
            })
        shapes.update({
            "model.norm.weight": (h,),
            "model.early_exit_gate.weight": (1, h),
            "model.early_exit_gate.bias": (1,),
            "lm_head.weight": (v, h),
        })
        return shapes
    h, f, v = cfg.n_embd, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * cfg.head_dim
    shapes = {"transformer.wte.weight": (v, h)}

    def block(prefix):
        shapes.update({
            prefix + "norm_1.weight": (h,),
            prefix + "attn.Wqkv.weight": (h + 2 * kv, h),
            prefix + "attn.proj.weight": (h, h),
            prefix + "norm_2.weight": (h,),
            prefix + "mlp.fc.weight": (2 * f, h),
            prefix + "mlp.proj.weight": (h, f),
            prefix + "norm_3.weight": (h,),
            prefix + "norm_4.weight": (h,),
        })
        if cfg.qk_bias:
            shapes[prefix + "attn.qk_bias"] = (2, 1, cfg.n_heads, cfg.head_dim)

    for i in range(cfg.n_layers_in_prelude):
        block(f"transformer.prelude.{i}.")
    shapes["transformer.adapter.weight"] = (h, 2 * h)
    for i in range(cfg.n_layers_in_recurrent_block):
        block(f"transformer.core_block.{i}.")
    for i in range(cfg.n_layers_in_coda):
        block(f"transformer.coda.{i}.")
    shapes["transformer.ln_f.weight"] = (h,)
    return shapes


def check_weight_names(names, expected: dict, family: str) -> None:
    """Raise CheckpointError naming unexpected tensors (names not in `expected`)."""
    unexpected = sorted(set(names) - set(expected))
    if unexpected:
        raise CheckpointError(f"unexpected tensor(s) for a {family} model: {unexpected[:5]}")


def check_weights_complete(seen, expected: dict, family: str) -> None:
    """Raise CheckpointError naming the tensors of `expected` that were not loaded."""
    missing = sorted(set(expected) - set(seen))
    if missing:
        raise CheckpointError(f"missing tensors for the {family} model: {missing[:5]}{'...' if len(missing) > 5 else ''}")


# Tensors a checkpoint may carry beyond hf_weight_shapes; the loader drops them.
OPTIONAL_EXTRA_TENSORS = {"huginn": ("lm_head.weight", "freqs_cis"), "ouro": ()}
