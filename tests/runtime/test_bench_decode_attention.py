"""perf/bench_decode_attention: the engine call it times is the engine's decode. On a tiny case (CPU
under the interpreter, or the GPU) `engine_call` writes each row's rotated new token into its slot
of the query's plane and attends over it: its cache matches the torch reference's RoPE + scatter,
its output the torch attention reference over that cache, both closely, and its cache and output
those of the two-launch path (`rope_kv_scatter`, then `paged_attention` with the decode arithmetic)
bit for bit, over bf16 and FP8 caches."""

import pytest
import torch

from perf import bench_decode_attention as bench
from rlt_kernels import attention, kv_cache
from rlt_kernels.norms import apply_rope_reference


@pytest.mark.parametrize("fp8", [False, True])
def test_engine_call_rotates_writes_and_attends_like_the_two_launches(monkeypatch, fp8):
    monkeypatch.setattr(bench, "HEADS", 2)
    monkeypatch.setattr(bench, "HEAD_DIM", 32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    keys = 40
    c = bench.engine_case(2, keys, context_limit=128, key_depth=False, device=device)
    if fp8:
        c = bench.fp8_case(c)
    new = bench.new_tokens(c, keys)
    scales = {n: c["kw"][n] for n in ("k_scale", "v_scale") if n in c["kw"]}
    before_k = c["k"].clone()

    ref_k, ref_v = c["k"].clone(), c["v"].clone()
    q_rot = kv_cache.rope_kv_scatter_reference(c["q"], new["k"], new["v"], new["positions"], new["cos_sin"],
                                               ref_k, ref_v, new["slots"], **scales)
    expected = attention.paged_attention_reference(q_rot, ref_k, ref_v, c["tables"], c["seq_lens"], c["qsl"], **c["kw"])
    two_k, two_v = c["k"].clone(), c["v"].clone()
    q_two = kv_cache.rope_kv_scatter(c["q"], new["k"], new["v"], new["positions"], new["cos_sin"], two_k, two_v,
                                     new["slots"], **scales)
    two = attention.paged_attention(q_two, two_k, two_v, c["tables"], c["seq_lens"], c["qsl"], decode_from=0,
                                    workspace=c["workspace"], **c["kw"])

    out = torch.empty_like(c["q"])
    bench.engine_call(c, new, out)()
    as_bits = (lambda t: t.view(torch.uint8)) if fp8 else (lambda t: t)  # noqa: E731
    assert not torch.equal(as_bits(c["k"]), as_bits(before_k))  # the new tokens were written
    assert torch.equal(as_bits(c["k"]), as_bits(two_k)) and torch.equal(as_bits(c["v"]), as_bits(two_v))
    for got, ref in ((c["k"], ref_k), (c["v"], ref_v)):  # rounding to the cache dtype may differ by a unit
        torch.testing.assert_close(got.float(), ref.float(), rtol=7e-2 if fp8 else 1e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)
    # The slot written is the query's plane's last key: read back through that plane's table.
    last_k = bench.dense_kv(c, keys)[0][:, :, keys - 1].float()
    k_rot = apply_rope_reference(new["k"], new["positions"], new["cos_sin"]).float()
    if fp8:
        k_rot = k_rot / c["kw"]["k_scale"][None, :, None]
    torch.testing.assert_close(last_k, k_rot, rtol=7e-2 if fp8 else 1e-2, atol=1e-2)
    assert torch.equal(out, two)


def test_fp8_plane_chunked_is_the_whole_tensor_quantization():
    """The chunked FP8 copy of a cache plane (bounded temporaries) gives the bits and the per-head
    scales of quantizing the whole tensor at once, chunks of uneven size included."""
    from rlt_kernels.fp8 import FP8_MAX, quantize_fp8

    t = torch.randn(7, 4, 3, 8).bfloat16() * torch.tensor([1.0, 5.0, 0.1]).bfloat16()[:, None]
    t[5, 2, 1, 3] = 900.0  # one head's amax in a late chunk
    scale = t.float().abs().amax(dim=(0, 1, 3)) / FP8_MAX
    whole = quantize_fp8(t, scale[None, None, :, None])
    got, got_scale = bench.fp8_plane(t, blocks_per_chunk=3)
    assert torch.equal(got_scale, scale)
    assert torch.equal(got.view(torch.uint8), whole.view(torch.uint8))
