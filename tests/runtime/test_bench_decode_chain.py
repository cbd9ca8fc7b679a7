"""perf/bench_decode_chain: its floor counts Ouro-1.4B's layer weights once per layer-loop, and its
chain runs (interpreter on CPU) with the same bits whichever way split attention is merged and
whether RoPE runs in the attention launch, and with only some rows live it computes those rows'
bits and leaves the others' K/V alone."""

import math

import pytest
import torch

from perf import bench_decode_chain as chain_bench
from rlt_runtime.models.configs import hf_weight_shapes
from rlt_runtime.models.presets import preset_config


def test_floor_bytes_are_the_layer_weights_of_every_loop():
    cfg = preset_config("ouro-1.4b")
    shapes = hf_weight_shapes(cfg)
    linear = sum(math.prod(s) for n, s in shapes.items() if ".layers." in n and len(s) == 2)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.intermediate_size, cfg.num_hidden_layers) == (
        chain_bench.HIDDEN, chain_bench.HEADS, chain_bench.FFN, chain_bench.LAYERS)
    assert chain_bench.weight_bytes() == 2 * linear * chain_bench.LOOPS
    assert chain_bench.weight_bytes(fp8=True) == linear * chain_bench.LOOPS


def test_tiny_chain_gives_one_result_whichever_way_ranges_merge(monkeypatch):
    for name, value in dict(HIDDEN=64, HEADS=2, HEAD_DIM=32, FFN=128, LAYERS=1, LOOPS=2, KEYS=40,
                            MAX_CONTEXT=128).items():
        monkeypatch.setattr(chain_bench, name, value)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    chain = chain_bench.Chain(2, device=device, dtype=torch.float32)
    combined = chain.step()
    chain.merge_in_place = True
    assert torch.equal(chain.step(), combined) and torch.isfinite(combined).all()
    assert not chain.range_counters.any()
    chain.fused_rope = True  # the engine's decode: RoPE and the K/V write inside the attention launch
    assert torch.equal(chain.step(), combined)
    chain.fused_rope = False
    for drop in chain_bench.ABLATIONS.values():  # every ablation runs, and leaving a kernel out changes the result
        chain.drop = frozenset(drop)
        out = chain.step()
        assert out.shape == combined.shape and (not drop or not torch.equal(out, combined))


def test_tiny_fp8_chain_reads_fp8_weights(monkeypatch):
    """--fp8: the chain's linears take FP8 weights with their scales (close to the bf16 chain's result)."""
    for name, value in dict(HIDDEN=64, HEADS=2, HEAD_DIM=32, FFN=128, LAYERS=1, LOOPS=1, KEYS=40,
                            MAX_CONTEXT=128).items():
        monkeypatch.setattr(chain_bench, name, value)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    chain = chain_bench.Chain(2, device=device, dtype=torch.float32, fp8=True)
    assert chain.layers[0]["qkv"].dtype == torch.float8_e4m3fn and chain.scales[0]["down"].dtype == torch.float32
    out, ref = chain.step(), chain_bench.Chain(2, device=device, dtype=torch.float32).step()
    assert torch.isfinite(out).all() and not torch.equal(out, ref)
    torch.testing.assert_close(out, ref, rtol=0.2, atol=0.2)


@pytest.mark.parametrize("fused_rope", [False, True])
def test_tiny_chain_with_fewer_live_rows(monkeypatch, fused_rope):
    """--live: every launch takes the live count, so the live rows get the full chain's bits (batch
    invariance) and the rows past them write no K/V."""
    for name, value in dict(HIDDEN=64, HEADS=2, HEAD_DIM=32, FFN=128, LAYERS=1, LOOPS=2, KEYS=40,
                            MAX_CONTEXT=128).items():
        monkeypatch.setattr(chain_bench, name, value)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    full = chain_bench.Chain(3, device=device, dtype=torch.float32)
    part = chain_bench.Chain(3, device=device, dtype=torch.float32)
    full.merge_in_place = part.merge_in_place = True
    full.fused_rope = part.fused_rope = fused_rope
    part.set_live(2)

    def third_row_kv(chain):  # layer 0's K and V at the cache slot of the row past the live ones
        return [cache.view(-1, *cache.shape[2:])[chain.slots[2]].clone() for cache in chain.caches[0]]

    before = third_row_kv(part)
    expected, got = full.step(), part.step()
    assert torch.equal(got[:2], expected[:2]) and torch.isfinite(expected).all()
    after = third_row_kv(part)
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    assert not torch.equal(third_row_kv(full)[0], before[0])  # the full chain writes that slot
    with pytest.raises(ValueError, match="live rows must be in 1..3"):
        part.set_live(4)
