"""The config.json files of the published checkpoints load; math fields rlt lacks are refused by name.

fixtures/configs/*.json reproduce, field for field, the config.json that the original configuration
classes write for the published checkpoints (Huginn-0125: `RavenConfig`, which also writes its
derived attributes `padded_vocab_size`, `head_dim`, `num_key_value_heads`, `effective_expected_depth`,
`init_values`, `test_time_noise*`; Ouro-1.4B/2.6B and their Thinking variants: `OuroConfig`), with
the values of reference/MODELS.md §1.2 / §2.1. Values MODELS.md does not pin are the classes'
defaults or the model cards' (`transformers_version`; Ouro's unused `max_window_layers`; the
Thinking variants' `pad_token_id` 0; Huginn's special token ids). Each test copies one into a
checkpoint directory and loads it through `load_config`, the loader's entry.
"""

import dataclasses
import json
import math
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

from rlt_runtime.errors import ConfigError
from rlt_runtime.models.checkpoint import iter_checkpoint, load_config
from rlt_runtime.models.configs import CONFIG_CLASSES, config_to_dict, hf_weight_shapes
from rlt_runtime.models.presets import preset_config, preset_weights

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "configs")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# fixture -> (family, hidden, layers, heads, kv heads, head_dim, intermediate, vocab, loops, rope theta,
#             context, eos ids, parameters of MODELS.md §6)
PUBLISHED = {
    "huginn-0125.json": ("huginn", 5280, (2, 4, 2), 55, 55, 96, 17920, 65536, 32, 50000.0, 4096, (65505,),
                         3_564_976_800),
    "ouro-1.4b.json": ("ouro", 2048, 24, 16, 16, 128, 5632, 49152, 4, 1e6, 65536, (0,), 1_434_652_673),
    "ouro-1.4b-thinking.json": ("ouro", 2048, 24, 16, 16, 128, 5632, 49152, 4, 1e6, 65536, (0,), 1_434_652_673),
    "ouro-2.6b.json": ("ouro", 2048, 48, 16, 16, 128, 5632, 49152, 4, 1e6, 65536, (0,), 2_667_974_657),
    "ouro-2.6b-thinking.json": ("ouro", 2048, 48, 16, 16, 128, 5632, 49152, 4, 1e6, 65536, (0,), 2_667_974_657),
}


def _published(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return json.load(f)


def _load(tmp_path, data, name="model"):
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(data))
    return load_config(str(path))


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_config_loads_with_its_shapes(tmp_path, name):
    (family, hidden, layers, heads, kv_heads, head_dim, inter, vocab, loops, theta, context, eos,
     params) = PUBLISHED[name]
    shutil.copy(os.path.join(FIXTURES, name), tmp_path / "config.json")
    cfg = load_config(str(tmp_path))
    assert cfg.family == family
    assert (cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.head_dim) == (hidden, heads, kv_heads, head_dim)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.num_loops) == (inter, vocab, loops)
    assert (cfg.rope_theta, cfg.max_model_len, cfg.norm_eps, cfg.eos_token_ids) == (theta, context, 1e-6, eos)
    if family == "ouro":
        assert cfg.num_hidden_layers == layers and not cfg.tie_word_embeddings
    else:
        assert (cfg.n_layers_in_prelude, cfg.n_layers_in_recurrent_block, cfg.n_layers_in_coda) == layers
        assert cfg.qk_bias and cfg.tie_embeddings and not cfg.bias
        assert math.isclose(cfg.embed_scale, math.sqrt(5280), rel_tol=1e-15)
    assert sum(math.prod(s) for s in hf_weight_shapes(cfg).values()) == params


@pytest.mark.parametrize("name,preset", [
    ("ouro-1.4b.json", "ouro-1.4b"), ("ouro-1.4b-thinking.json", "ouro-1.4b"), ("ouro-2.6b.json", "ouro-2.6b"),
    ("ouro-2.6b-thinking.json", "ouro-2.6b"), ("huginn-0125.json", "huginn-0125"),
])
def test_published_config_is_the_presets_model(tmp_path, name, preset):
    """The random-init presets replicate the published models: same config up to the stop ids."""
    cfg = _load(tmp_path, _published(name))
    # The preset stops on the tokenizer's end-of-turn id too (65508); config.json lists 65505 only.
    assert cfg == dataclasses.replace(preset_config(preset), eos_token_id=cfg.eos_token_id)


def test_huginn_attribute_map_spellings(tmp_path):
    """RavenConfig.attribute_map names (the repository's own json writes num_attention_heads) parse too."""
    data = _published("huginn-0125.json")
    renamed = {k: v for k, v in data.items() if k not in ("n_embd", "n_heads")}
    renamed.update(hidden_size=data["n_embd"], num_attention_heads=data["n_heads"])
    assert _load(tmp_path, renamed, "aliases") == _load(tmp_path, data, "published")
    both = {**data, "hidden_size": 5280, "num_attention_heads": 55, "num_hidden_layers": 8}
    assert _load(tmp_path, both, "both") == _load(tmp_path, data, "published")


def test_every_field_rule_is_documented():
    """docs/options.md names every field rlt parses, checks, refuses or ignores (so every published one)."""
    with open(os.path.join(REPO, "docs", "options.md"), encoding="utf-8") as f:
        docs = f.read()
    for cls in CONFIG_CLASSES.values():
        known = ({f.name for f in dataclasses.fields(cls)} | set(cls.ALIASES) | set(cls.MATH_FIELDS)
                 | set(cls.CHECKED_FIELDS) | set(cls.NO_MATH_FIELDS))
        missing = sorted(key for key in known if f"`{key}`" not in docs)
        assert not missing, (cls.model_type, missing)


def _shrunk(data):
    """A published config with CPU-sized shapes (derived fields recomputed), every other field kept."""
    data = json.loads(json.dumps(data))
    if data["model_type"] == "ouro":
        data.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, head_dim=16, vocab_size=320, max_window_layers=2,
                    layer_types=["full_attention"] * 2)
        return data
    h, depth = 64, 1 + 1 + 2 * 3
    std = math.sqrt(2 / (5 * h))
    data.update(n_embd=h, n_heads=4, num_key_value_heads=4, head_dim=16, intermediate_size=96, vocab_size=320,
                padded_vocab_size=320, n_layers=4, n_layers_in_prelude=1, n_layers_in_recurrent_block=2,
                n_layers_in_coda=1, mean_recurrence=3, effective_expected_depth=depth, bos_token_id=288,
                eos_token_id=289, pad_token_id=293,
                init_values={"std": std, "out_proj": std / math.sqrt(2 * depth), "embedding": std,
                             "embed_scale": math.sqrt(h)})
    return data


@pytest.mark.parametrize("name", ["ouro-2.6b-thinking.json", "huginn-0125.json"])
def test_published_fields_load_a_checkpoint(tmp_path, name):
    """A checkpoint directory whose config.json carries every published field streams its tensors."""
    cfg = _load(tmp_path, _shrunk(_published(name)))
    weights = dict(preset_weights(cfg, seed=3))
    save_file(weights, str(tmp_path / "model" / "model.safetensors"))
    loaded = dict(iter_checkpoint(str(tmp_path / "model"), cfg, dtype=torch.float32))
    assert sorted(loaded) == sorted(hf_weight_shapes(cfg))
    assert all(torch.equal(loaded[n], weights[n]) for n in weights)


# Fields that do not change the math: any value gives the same parsed config.
NO_MATH_CHANGES = {
    "huginn-0125.json": {
        "padding_multiple": 64, "init_orthogonal": True, "init_strategy": "normal", "sampling_scheme": "fixed",
        "mean_backprop_depth": 32, "activation_checkpoint_impl": "none", "effective_expected_depth": 7,
        "test_time_noise_type": "geom", "torch_dtype": "float32", "dtype": "float16",
        "transformers_version": "4.99.0", "architectures": ["Something"], "auto_map": {}, "use_cache": False,
        "init_values": {"std": math.sqrt(2 / (5 * 5280)), "out_proj": 1.0, "embedding": 2.0,
                        "embed_scale": math.sqrt(5280)},
        "name": "nebel-raven-3.5b", "hf_config": {"org": "x", "name": "y"}, "_name_or_path": "/somewhere",
        "output_hidden_states": True, "temperature": 0.7, "id2label": {"0": "A"},
    },
    "ouro-1.4b.json": {
        "initializer_range": 0.5, "use_cache": False, "attention_dropout": 0.1, "max_window_layers": 3,
        "sliding_window": 4096, "chunk_size": 2, "pad_token_id": 5, "torch_dtype": "float32",
        "dtype": "bfloat16", "transformers_version": "4.55.0", "auto_map": {}, "architectures": [],
        "return_dict": False, "top_p": 0.7, "num_labels": 3,
    },
}


@pytest.mark.parametrize("name", sorted(NO_MATH_CHANGES))
def test_no_math_fields_take_any_value(tmp_path, name):
    base = _load(tmp_path, _published(name), "base")
    for key, value in NO_MATH_CHANGES[name].items():
        changed = _load(tmp_path, {**_published(name), key: value}, key)
        exempt = {"initializer_range"}  # kept for the preset's own initialisation, not for the forward pass
        assert {k: v for k, v in config_to_dict(changed).items() if k not in exempt} == \
            {k: v for k, v in config_to_dict(base).items() if k not in exempt}, key


# (fixture, field, unsupported value, text the error must contain besides the field's name)
UNSUPPORTED = [
    ("ouro-1.4b.json", "hidden_act", "gelu", "'silu'"),
    ("ouro-1.4b.json", "rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "None"),
    ("ouro-1.4b.json", "rope_scaling", {"rope_type": "linear", "factor": 2.0}, "'default'"),
    ("ouro-1.4b.json", "use_sliding_window", True, "False"),
    ("ouro-1.4b.json", "layer_types", ["full_attention"] * 23 + ["sliding_attention"], "'full_attention'"),
    ("ouro-1.4b.json", "layer_types", ["full_attention"] * 23, "24"),
    ("ouro-1.4b.json", "attention_bias", True, "False"),
    ("ouro-1.4b.json", "mlp_bias", True, "False"),
    ("ouro-1.4b.json", "early_exit_threshold", 0.5, "SamplingParams.exit_threshold"),
    ("ouro-1.4b.json", "early_exit_threshold", True, "1.0"),  # a boolean is not the number 1
    ("ouro-1.4b.json", "early_exit_step", 2, "max_loops"),
    ("ouro-1.4b.json", "tie_word_embeddings", True, "false"),
    ("ouro-1.4b.json", "pruned_heads", {"0": [1]}, "{}"),
    ("ouro-1.4b.json", "is_encoder_decoder", True, "False"),
    ("ouro-1.4b.json", "add_cross_attention", True, "False"),
    ("ouro-1.4b.json", "total_ut_steps", 9, "1..8"),
    ("huginn-0125.json", "norm_class_name", "RMSNorm", "'RMSNorm_llama'"),
    ("huginn-0125.json", "nonlin_name", "GELU", "'SiLU'"),
    ("huginn-0125.json", "mlp_class_name", "BaseMLP", "'GatedMLP'"),
    ("huginn-0125.json", "block_class_name", "TransformerPreNormBlock", "'SandwichBlock'"),
    ("huginn-0125.json", "architecture_class_name", "GPT", "'RecurrentGPT'"),
    ("huginn-0125.json", "injection_type", "add", "'linear'"),
    ("huginn-0125.json", "state_init", "zero", "'like-init'"),
    ("huginn-0125.json", "test_time_noise", 0.1, "0"),
    ("huginn-0125.json", "bias", True, "false"),
    ("huginn-0125.json", "tie_embeddings", False, "true"),
    ("huginn-0125.json", "tie_word_embeddings", False, "tie_embeddings"),
    ("huginn-0125.json", "head_dim", 64, "n_embd / n_heads"),
    ("huginn-0125.json", "n_layers", 9, "8"),
    ("huginn-0125.json", "num_hidden_layers", 7, "8"),
    ("huginn-0125.json", "padded_vocab_size", 65600, "65536"),
    ("huginn-0125.json", "hidden_size", 4096, "5280"),
    ("huginn-0125.json", "num_attention_heads", 32, "55"),
    ("huginn-0125.json", "init_values", {"std": 0.02, "out_proj": 0.001, "embedding": 0.02, "embed_scale": 72.66},
     "std"),
    ("huginn-0125.json", "init_values", {"std": math.sqrt(2 / 26400), "embed_scale": 1.0}, "embed_scale"),
    ("huginn-0125.json", "mean_recurrence", 0, "1..128"),
]


@pytest.mark.parametrize("name,key,value,allowed", UNSUPPORTED,
                         ids=[f"{n.split('.json')[0]}-{k}-{i}" for i, (n, k, _, _) in enumerate(UNSUPPORTED)])
def test_unsupported_math_value_is_rejected_by_name(tmp_path, name, key, value, allowed):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, {**_published(name), key: value})
    message = str(err.value)
    assert "config.json" in message and key in message and allowed in message, message


@pytest.mark.parametrize("name,key", [
    ("huginn-0125.json", "rope_settings"), ("huginn-0125.json", "randomize_embedding"),
    ("huginn-0125.json", "iter_injection"), ("ouro-1.4b.json", "use_mla"), ("ouro-2.6b.json", "qk_norm"),
])
def test_unknown_field_is_rejected_by_name(tmp_path, name, key):
    with pytest.raises(ConfigError, match=rf"config\.json: unsupported field '{key}' for model_type"):
        _load(tmp_path, {**_published(name), key: 1})


def test_field_rules_are_disjoint_and_cover_the_published_fields():
    """No field is in two categories; every field of a published config has a rule."""
    for model_type, cls in CONFIG_CLASSES.items():
        kinds = [{f.name for f in dataclasses.fields(cls)} | set(cls.ALIASES), set(cls.MATH_FIELDS),
                 set(cls.CHECKED_FIELDS), set(cls.NO_MATH_FIELDS)]
        for i, a in enumerate(kinds):
            for b in kinds[i + 1:]:
                assert not a & b, (model_type, a & b)
        for name in PUBLISHED:
            data = _published(name)
            if data["model_type"] == model_type:
                assert set(data) - {"model_type"} <= set.union(*kinds), name
