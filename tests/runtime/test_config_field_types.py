"""Every parsed config.json field has a type and a range; any other value is a ConfigError naming it.

The specification below is written here, independently of config_fields.py: sizes are integers
(not booleans, not floats) in 1..2**31 - 1 (layer counts 1..1024), the head width an even integer up to 256, the RoPE base
a finite number above 1, the norm epsilon a finite number in [2**-126, 1], loops 1..8 (Ouro) or
1..128 (Huginn), booleans true or false only, token ids integers in the vocabulary. The tests load
the published config.json files with one field changed, and the bad values the issue reported
through `LLM(...)` itself.
"""

import dataclasses
import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlt_runtime import LLM
from rlt_runtime.errors import ConfigError
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.configs import CONFIG_CLASSES, OuroConfig, config_from_dict, config_to_dict
from rlt_runtime.models.presets import preset_config, preset_weights

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "configs")
SOURCE = "/models/x/config.json"


def _published(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def _int_in(low, high, step=1):
    return lambda v: type(v) is int and low <= v <= high and v % step == 0


def _number(v):
    if type(v) not in (int, float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


SIZE = _int_in(1, 2**31 - 1)
LAYERS = _int_in(1, 1024)
ROPE = lambda v: _number(v) and v > 1  # noqa: E731
EPS = lambda v: _number(v) and 2.0**-126 <= v <= 1  # noqa: E731


def _ids(vocab):
    one = lambda v: type(v) is int and 0 <= v < vocab  # noqa: E731
    return one, lambda v: one(v) or (type(v) is list and len(v) > 0 and all(one(x) for x in v))


OURO_ID, OURO_IDS = _ids(49152)
HUGINN_ID, HUGINN_IDS = _ids(65536)
# field -> whether a value is well-typed and in range (cross-field rules aside)
SPEC = {
    "ouro-1.4b.json": {
        "vocab_size": SIZE, "hidden_size": SIZE, "intermediate_size": SIZE, "num_hidden_layers": LAYERS,
        "num_attention_heads": SIZE, "num_key_value_heads": SIZE, "head_dim": _int_in(2, 256, 2),
        "rope_theta": ROPE, "max_position_embeddings": SIZE, "rms_norm_eps": EPS, "total_ut_steps": _int_in(1, 8),
        "bos_token_id": OURO_ID, "eos_token_id": OURO_IDS, "initializer_range": lambda v: _number(v) and v > 0,
        "tie_word_embeddings": lambda v: type(v) is bool,
    },
    "huginn-0125.json": {
        "vocab_size": SIZE, "n_embd": SIZE, "hidden_size": SIZE, "n_heads": SIZE, "num_attention_heads": SIZE,
        "num_key_value_heads": SIZE, "intermediate_size": SIZE, "n_layers_in_prelude": LAYERS,
        "n_layers_in_recurrent_block": LAYERS, "n_layers_in_coda": LAYERS, "mean_recurrence": _int_in(1, 128),
        "block_size": SIZE, "rope_base": ROPE, "norm_eps": EPS, "qk_bias": lambda v: type(v) is bool,
        "bias": lambda v: type(v) is bool, "tie_embeddings": lambda v: type(v) is bool,
        "init_scale": lambda v: _number(v) and 0 <= v <= 1, "bos_token_id": HUGINN_ID, "eos_token_id": HUGINN_IDS,
        "pad_token_id": HUGINN_ID,
    },
}


def test_spec_covers_every_parsed_field():
    """The tables here and in config_fields.py name the same fields (dataclass fields plus aliases)."""
    for name, spec in SPEC.items():
        cls = CONFIG_CLASSES[_published(name)["model_type"]]
        assert set(spec) == set(cls.PARSED) | set(cls.ALIASES)
        assert set(cls.PARSED) == {f.name for f in dataclasses.fields(cls)}


def _with_field(name, field, value):
    """The published config with `field` set to `value` (a Huginn alias replaces its target)."""
    data = _published(name)
    aliases = CONFIG_CLASSES[data["model_type"]].ALIASES
    if field in aliases:
        data.pop(aliases[field])
    data[field] = value
    return data


def _assert_refused_by_name(data, field):
    with pytest.raises(ConfigError) as err:
        config_from_dict(data, source=SOURCE)
    message = str(err.value)
    assert message.startswith(SOURCE) and f"'{field}'" in message, (field, message)


MISTYPED = st.one_of(
    st.none(), st.booleans(), st.text(max_size=5), st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-2**40, 2**40), st.sampled_from([0, -1, 2**31, 10**400, 257, 258, 3, 2.0**-127, 1.0, 1, 2**-126, 1025,
                                                 "4", "1e-6", 4.0, [], [1], [[1]], {}, {"a": 1}, [1, "x"]]),
    st.lists(st.integers(-5, 70000) | st.text(max_size=2) | st.none(), max_size=3),
)


@settings(max_examples=400)
@given(data=st.data())
def test_any_value_of_a_parsed_field_loads_only_if_well_typed(data):
    """Ill-typed or out-of-range: ConfigError naming the field. Well-typed: it loads, or cross-field
    rules refuse it with a ConfigError. Never another exception."""
    name = data.draw(st.sampled_from(sorted(SPEC)))
    field = data.draw(st.sampled_from(sorted(SPEC[name])))
    value = data.draw(MISTYPED)
    config = _with_field(name, field, value)
    if not SPEC[name][field](value):
        _assert_refused_by_name(config, field)
        return
    try:
        config_from_dict(config, source=SOURCE)
    except ConfigError as exc:
        assert str(exc).startswith(SOURCE)


@pytest.mark.parametrize("field, value", [
    ("rms_norm_eps", None), ("rms_norm_eps", -1e-6), ("rms_norm_eps", 0), ("rms_norm_eps", 1e-45),
    ("rms_norm_eps", float("nan")), ("rope_theta", "abc"), ("rope_theta", 0), ("rope_theta", -10000.0),
    ("rope_theta", 1.0), ("rope_theta", float("inf")), ("total_ut_steps", "4"), ("total_ut_steps", 4.0),
    ("max_position_embeddings", 10**12), ("head_dim", 512), ("head_dim", 15), ("hidden_size", True),
    ("bos_token_id", 49152), ("eos_token_id", [0, 49152]), ("eos_token_id", []), ("eos_token_id", "0"),
    ("tie_word_embeddings", 0), ("initializer_range", 0), ("num_hidden_layers", 2**31 - 1),
])
def test_reported_bad_values(field, value):
    _assert_refused_by_name(_with_field("ouro-1.4b.json", field, value), field)


def test_huginn_alias_is_named_as_spelled_in_the_file():
    _assert_refused_by_name(_with_field("huginn-0125.json", "hidden_size", "5280"), "hidden_size")
    _assert_refused_by_name(_with_field("huginn-0125.json", "num_attention_heads", 0), "num_attention_heads")
    _assert_refused_by_name(_with_field("huginn-0125.json", "pad_token_id", 65536), "pad_token_id")
    _assert_refused_by_name(_with_field("huginn-0125.json", "init_scale", 2.0), "init_scale")


def test_huginn_head_width_is_bounded_by_the_kernels():
    data = {**_published("huginn-0125.json"), "n_embd": 1024, "n_heads": 2, "num_key_value_heads": 2}
    with pytest.raises(ConfigError, match=r"n_embd / n_heads \(1024 / 2 = 512\) must be even \(RoPE\) and at most 256"):
        config_from_dict(data, source=SOURCE)


def test_derived_ouro_head_dim_names_its_inputs():
    data = {k: v for k, v in _published("ouro-1.4b.json").items() if k != "head_dim"}
    assert config_from_dict(data, source=SOURCE).head_dim == 128
    with pytest.raises(ConfigError, match=r"'head_dim' is absent, so it is hidden_size // num_attention_heads "
                                          r"\(2048 // 4 = 512\)"):
        config_from_dict({**data, "num_attention_heads": 4, "num_key_value_heads": 4}, source=SOURCE)
    _assert_refused_by_name({**data, "hidden_size": "2048"}, "hidden_size")


def test_direct_construction_checks_types_too():
    with pytest.raises(ConfigError, match=r"field 'rms_norm_eps' = None must be a finite number"):
        OuroConfig(rms_norm_eps=None)


# ---- the reported configs, through LLM(...) ----------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A loadable ouro-tiny checkpoint directory and its config.json dict."""
    path = tmp_path_factory.mktemp("ouro-tiny")
    cfg = preset_config("ouro-tiny")
    save_checkpoint(str(path), cfg, preset_weights(cfg, seed=0))
    return path, config_to_dict(cfg)


@pytest.mark.parametrize("field, value", [
    ("rms_norm_eps", None), ("rope_theta", "abc"), ("total_ut_steps", "4"), ("max_position_embeddings", 10**12),
    ("rms_norm_eps", -1e-6), ("rope_theta", 0), ("rope_theta", -1.0),
])
def test_reported_configs_fail_at_llm_construction(checkpoint, field, value):
    path, data = checkpoint
    (path / "config.json").write_text(json.dumps({**data, field: value}))
    try:
        with pytest.raises(ConfigError) as err:
            LLM(str(path), dtype="float32", max_num_seqs=2)
    finally:
        (path / "config.json").write_text(json.dumps(data))
    assert str(path / "config.json") in str(err.value) and f"'{field}'" in str(err.value), str(err.value)
