"""Presets (configs, deterministic init) and checkpoint loading/writing, including every error."""

import json
import math
import os
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from rlt_runtime.errors import CheckpointError, ConfigError
from rlt_runtime.models.checkpoint import iter_checkpoint, load_config, resolve_model, save_checkpoint
from rlt_runtime.models.configs import HuginnConfig, OuroConfig, config_to_dict, hf_weight_shapes
from rlt_runtime.models.presets import PRESETS, preset_config, preset_weights

# Ratio std(truncated at ±3σ) / σ for a normal distribution.
TRUNC3_STD_RATIO = math.sqrt(1 - 6 * math.exp(-4.5) / math.sqrt(2 * math.pi) / math.erf(3 / math.sqrt(2)))


def _params(cfg):
    return sum(math.prod(s) for s in hf_weight_shapes(cfg).values())


# ---- presets ----------------------------------------------------------------------------------

def test_preset_names_and_real_shapes():
    assert set(PRESETS) == {"ouro-tiny", "huginn-tiny", "ouro-1.4b", "ouro-2.6b", "huginn-0125"}
    # Parameter totals of MODELS.md §6 pin every real shape.
    assert _params(preset_config("ouro-1.4b")) == 1_434_652_673
    assert _params(preset_config("ouro-2.6b")) == 2_667_974_657
    assert _params(preset_config("huginn-0125")) == 3_564_976_800
    h = preset_config("huginn-0125")
    assert (h.n_embd, h.n_heads, h.head_dim, h.mean_recurrence, h.bos_token_id) == (5280, 55, 96, 32, 65504)


@pytest.mark.parametrize("name", ["ouro-tiny", "huginn-tiny"])
def test_tiny_presets_exercise_gqa(name):
    cfg = preset_config(name)
    assert (cfg.hidden_size, cfg.num_heads, cfg.kv_heads, cfg.head_dim, cfg.num_loops) == (64, 4, 2, 16, 4)
    assert cfg.vocab_size == 320


def test_unknown_preset_lists_valid_names():
    with pytest.raises(CheckpointError, match="unknown preset 'ouro-7b'.*huginn-tiny.*ouro-tiny"):
        preset_config("ouro-7b")


@pytest.mark.parametrize("name", ["ouro-tiny", "huginn-tiny"])
def test_preset_weights_cover_shapes_and_are_deterministic(name):
    cfg = preset_config(name)
    a = dict(preset_weights(cfg, seed=3))
    b = dict(preset_weights(cfg, seed=3))
    c = dict(preset_weights(cfg, seed=4))
    shapes = hf_weight_shapes(cfg)
    assert list(a) == list(shapes) and all(tuple(a[n].shape) == shapes[n] for n in shapes)
    assert "freqs_cis" not in a and (cfg.family == "ouro" or "lm_head.weight" not in a)
    assert all(torch.equal(a[n], b[n]) for n in a)
    random_names = [n for n in a if a[n].numel() > 1 and a[n].std() > 0]
    assert random_names and all(not torch.equal(a[n], c[n]) for n in random_names)
    half = dict(preset_weights(cfg, seed=3, dtype=torch.bfloat16))
    assert all(half[n].dtype == torch.bfloat16 and torch.equal(half[n], a[n].to(torch.bfloat16)) for n in a)


def test_ouro_init_statistics():
    cfg = OuroConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                     num_attention_heads=4, num_key_value_heads=4, head_dim=64)
    w = dict(preset_weights(cfg))
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"):
        assert abs(w[name].mean()) < 2e-3 and abs(w[name].std() / 0.02 - 1) < 0.03, name
    assert torch.all(w["model.layers.0.input_layernorm_2.weight"] == 1) and torch.all(w["model.norm.weight"] == 1)
    assert torch.all(w["model.early_exit_gate.bias"] == 0) and w["model.early_exit_gate.weight"].std() > 0


def test_huginn_init_statistics_and_truncation():
    cfg = HuginnConfig(vocab_size=512, n_embd=256, n_heads=4, num_key_value_heads=2, intermediate_size=512,
                       n_layers_in_prelude=1, n_layers_in_recurrent_block=1, n_layers_in_coda=1, mean_recurrence=8)
    std, out_std = math.sqrt(2 / (5 * 256)), math.sqrt(2 / (5 * 256)) / math.sqrt(2 * (1 + 1 + 8))
    assert (cfg.init_std, cfg.out_proj_std) == pytest.approx((std, out_std))
    w = dict(preset_weights(cfg, seed=1))
    fc = w["transformer.core_block.0.mlp.fc.weight"]
    cases = {
        "wte": (w["transformer.wte.weight"], std), "Wqkv": (w["transformer.prelude.0.attn.Wqkv.weight"], std),
        "adapter": (w["transformer.adapter.weight"], std), "fc gate half": (fc[:512], std),
        "fc up half": (fc[512:], out_std), "attn.proj": (w["transformer.coda.0.attn.proj.weight"], out_std),
        "mlp.proj": (w["transformer.coda.0.mlp.proj.weight"], out_std),
    }
    for label, (t, s) in cases.items():
        assert t.abs().max() <= 3 * s * (1 + 1e-6), label
        assert t.abs().max() > 2.5 * s, label  # really a (truncated) normal, not a narrower one
        assert abs(t.std() / (s * TRUNC3_STD_RATIO) - 1) < 0.03, label
    assert torch.all(w["transformer.ln_f.weight"] == 1) and torch.all(w["transformer.coda.0.norm_3.weight"] == 1)
    assert w["transformer.prelude.0.attn.qk_bias"].shape == (2, 1, 4, 64)
    assert torch.all(w["transformer.prelude.0.attn.qk_bias"] == 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["ouro-1.4b", "huginn-0125"])
def test_real_preset_streams_one_tensor_at_a_time_on_gpu(name):
    cfg = preset_config(name)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    kept, largest = [], 0
    for _, t in preset_weights(cfg, device="cuda", dtype=torch.bfloat16):
        assert t.is_cuda and t.dtype == torch.bfloat16
        kept.append(t)
        largest = max(largest, t.numel())
    total = sum(t.numel() * 2 for t in kept)
    assert total == _params(cfg) * 2
    # Peak = the bf16 model plus at most one fp32 scratch tensor (plus its bf16 copy), never 2x.
    assert torch.cuda.max_memory_allocated() - base <= total + largest * 6 + (64 << 20)


# ---- checkpoints: round trips -----------------------------------------------------------------

def _save_preset(tmp_path, name, **kwargs):
    cfg = preset_config(name)
    weights = dict(preset_weights(cfg, seed=7))
    path = str(tmp_path / name)
    save_checkpoint(path, cfg, weights, **kwargs)
    return path, cfg, weights


@pytest.mark.parametrize("name", ["ouro-tiny", "huginn-tiny"])
def test_round_trip_single_file(tmp_path, name):
    path, cfg, weights = _save_preset(tmp_path, name)
    assert sorted(os.listdir(path)) == ["config.json", "model.safetensors"]
    assert resolve_model(path) == ("dir", path)
    assert load_config(path) == cfg
    loaded = dict(iter_checkpoint(path, cfg, dtype=torch.float32))
    assert sorted(loaded) == sorted(weights)
    assert all(torch.equal(loaded[n], weights[n]) for n in weights)


def test_round_trip_sharded(tmp_path):
    path, cfg, weights = _save_preset(tmp_path, "ouro-tiny", max_shard_bytes=60_000)
    files = sorted(os.listdir(path))
    shards = [f for f in files if f.startswith("model-")]
    assert "model.safetensors.index.json" in files and "model.safetensors" not in files and len(shards) >= 3
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    assert set(index["weight_map"]) == set(weights)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in weights.values())
    loaded = dict(iter_checkpoint(path, cfg, dtype=torch.float32))
    assert set(loaded) == set(weights) and all(torch.equal(loaded[n], weights[n]) for n in weights)


def test_dtype_handling(tmp_path):
    path, cfg, weights = _save_preset(tmp_path, "ouro-tiny", dtype=torch.bfloat16)
    kept = dict(iter_checkpoint(path, cfg))  # bf16 stays bf16
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, weights[n].to(torch.bfloat16)) for n, t in kept.items())
    fp32_path, _, _ = _save_preset(tmp_path / "fp32", "ouro-tiny")
    cast = dict(iter_checkpoint(fp32_path, cfg))  # fp32 checkpoints are cast to bf16 by default
    assert all(t.dtype == torch.bfloat16 and torch.equal(t, weights[n].to(torch.bfloat16)) for n, t in cast.items())
    half = dict(iter_checkpoint(fp32_path, cfg, dtype=torch.float16))
    assert all(t.dtype == torch.float16 for t in half.values())


def test_huginn_duplicate_head_and_freqs_cis_are_dropped(tmp_path):
    cfg = preset_config("huginn-tiny")
    weights = dict(preset_weights(cfg))
    extra = dict(weights)
    extra["lm_head.weight"] = weights["transformer.wte.weight"].clone()
    extra["freqs_cis"] = torch.zeros(1, cfg.block_size, 1, cfg.head_dim // 2, 2)
    save_checkpoint(str(tmp_path), cfg, extra)
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(extra)
    loaded = dict(iter_checkpoint(str(tmp_path), cfg, dtype=torch.float32))
    assert sorted(loaded) == sorted(hf_weight_shapes(cfg))
    # A duplicate head that does not match the embedding's shape is an error.
    extra["lm_head.weight"] = torch.zeros(cfg.vocab_size, cfg.n_embd + 1)
    save_file({k: v.contiguous() for k, v in extra.items()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="lm_head.weight.*embedding"):
        iter_checkpoint(str(tmp_path), cfg)


@pytest.mark.gpu
def test_stream_to_gpu_in_bf16(tmp_path):
    path, cfg, weights = _save_preset(tmp_path, "huginn-tiny")
    loaded = dict(iter_checkpoint(path, cfg, device="cuda"))
    assert all(t.is_cuda and t.dtype == torch.bfloat16 for t in loaded.values())
    assert all(torch.equal(loaded[n].cpu(), weights[n].to(torch.bfloat16)) for n in weights)


# ---- checkpoints: every error -----------------------------------------------------------------

def _rewrite(path, mutate):
    """Load model.safetensors, apply mutate(dict), write it back."""
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    mutate(tensors)
    save_file(tensors, file)
    return file


def test_missing_key(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    _rewrite(path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: missing tensors \['model.layers.1.mlp.up_proj"):
        iter_checkpoint(path, cfg)


def test_unexpected_key(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    _rewrite(path, lambda t: t.__setitem__("model.layers.9.extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: unexpected tensor 'model.layers.9.extra.weight'"):
        iter_checkpoint(path, cfg)


def test_wrong_shape_is_caught_before_any_tensor_is_yielded(tmp_path):
    path, cfg, weights = _save_preset(tmp_path, "ouro-tiny", max_shard_bytes=60_000)
    index = json.load(open(os.path.join(path, "model.safetensors.index.json")))
    last_shard = sorted(set(index["weight_map"].values()))[-1]
    file = os.path.join(path, last_shard)
    tensors = load_file(file)
    victim = sorted(tensors)[0]
    tensors[victim] = torch.zeros(3, 3)
    save_file(tensors, file)
    with pytest.raises(CheckpointError, match=rf"{last_shard}: tensor '{victim}' has shape \[3, 3\], expected"):
        iter_checkpoint(path, cfg)  # raises on the call itself: nothing was streamed


def test_saver_rejects_bad_tensors(tmp_path):
    cfg = preset_config("ouro-tiny")
    weights = dict(preset_weights(cfg))
    with pytest.raises(CheckpointError, match="save_checkpoint: missing tensors"):
        save_checkpoint(str(tmp_path), cfg, {k: v for k, v in weights.items() if k != "lm_head.weight"})
    with pytest.raises(CheckpointError, match="save_checkpoint: tensor 'lm_head.weight' has shape"):
        save_checkpoint(str(tmp_path), cfg, {**weights, "lm_head.weight": torch.zeros(2, 2)})
    with pytest.raises(CheckpointError, match="save_checkpoint: unexpected tensor 'freqs_cis'"):
        save_checkpoint(str(tmp_path), cfg, {**weights, "freqs_cis": torch.zeros(2)})


def test_non_float_tensor(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    _rewrite(path, lambda t: t.__setitem__("model.norm.weight", torch.ones(64, dtype=torch.int32)))
    with pytest.raises(CheckpointError, match="tensor 'model.norm.weight' has dtype I32"):
        iter_checkpoint(path, cfg)


def test_unsupported_config_field_and_bad_model_type(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    cfg_file = os.path.join(path, "config.json")
    data = config_to_dict(cfg)
    json.dump({**data, "use_mla": True}, open(cfg_file, "w"))
    with pytest.raises(ConfigError, match=r"config\.json: unsupported field 'use_mla'"):
        load_config(path)
    json.dump({**data, "model_type": "llama"}, open(cfg_file, "w"))
    with pytest.raises(ConfigError, match=r"config\.json: model_type must be one of .*got 'llama'"):
        load_config(path)
    open(cfg_file, "w").write("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json: invalid JSON"):
        load_config(path)
    os.remove(cfg_file)
    with pytest.raises(CheckpointError, match=r"config\.json: model config file not found"):
        load_config(path)


def test_pickle_only_checkpoint_is_refused(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    os.remove(os.path.join(path, "model.safetensors"))
    with pytest.raises(CheckpointError, match="no model.safetensors or model.safetensors.index.json"):
        iter_checkpoint(path, cfg)
    open(os.path.join(path, "pytorch_model.bin"), "wb").write(b"\x80\x02pickle")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*pickle checkpoints are refused"):
        iter_checkpoint(path, cfg)


def test_truncated_safetensors(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    file = os.path.join(path, "model.safetensors")
    data = open(file, "rb").read()
    open(file, "wb").write(data[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated safetensors file: tensor"):
        iter_checkpoint(path, cfg)
    open(file, "wb").write(data[:5])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: truncated safetensors file \(5 bytes"):
        iter_checkpoint(path, cfg)


def test_corrupt_header(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny")
    file = os.path.join(path, "model.safetensors")
    data = bytearray(open(file, "rb").read())
    (n,) = struct.unpack("<Q", data[:8])
    garbled = data[:8] + b"#" * 16 + data[24:]
    open(file, "wb").write(garbled)
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt safetensors header"):
        iter_checkpoint(path, cfg)
    open(file, "wb").write(struct.pack("<Q", 10 ** 12) + data[8:])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt or truncated safetensors header"):
        iter_checkpoint(path, cfg)
    # Offsets inconsistent with the declared shape.
    header = json.loads(bytes(data[8:8 + n]))
    name = "model.norm.weight"
    header[name]["data_offsets"][1] -= 4
    raw = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    assert len(raw) == n
    open(file, "wb").write(data[:8] + raw + data[8 + n:])
    with pytest.raises(CheckpointError, match=rf"corrupt safetensors header: tensor '{name}' offsets"):
        iter_checkpoint(path, cfg)


def test_sharded_index_errors(tmp_path):
    path, cfg, _ = _save_preset(tmp_path, "ouro-tiny", max_shard_bytes=60_000)
    index_file = os.path.join(path, "model.safetensors.index.json")
    index = json.load(open(index_file))
    bad = {**index, "weight_map": {**index["weight_map"], "model.norm.weight": "model-00099-of-00099.safetensors"}}
    json.dump(bad, open(index_file, "w"))
    with pytest.raises(CheckpointError, match="shard file 'model-00099-of-00099.safetensors' not found"):
        iter_checkpoint(path, cfg)
    json.dump({"weights": {}}, open(index_file, "w"))
    with pytest.raises(CheckpointError, match="expected a 'weight_map' object"):
        iter_checkpoint(path, cfg)
    open(os.path.join(path, "model.safetensors"), "wb").write(b"")
    with pytest.raises(CheckpointError, match="both model.safetensors and model.safetensors.index.json"):
        iter_checkpoint(path, cfg)


def test_resolve_model(tmp_path):
    assert resolve_model("huginn-tiny") == ("preset", "huginn-tiny")
    assert resolve_model(str(tmp_path)) == ("dir", str(tmp_path))
    missing = str(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"neither an existing checkpoint directory nor a preset name; "
                                              r"presets: huginn-0125, huginn-tiny, ouro-1\.4b"):
        resolve_model(missing)
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(CheckpointError, match="neither an existing checkpoint directory"):
        resolve_model(str(a_file))
