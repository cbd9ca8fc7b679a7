"""Paged attention on the H200: decode bandwidth, long-context split-KV, prefill FLOP rate.

    pytest perf/test_bench_attention.py --benchmark-json=out/attention.json

Decode (the decode arithmetic, ``decode_from=0``; the tile kernel's time is recorded beside it)
is bandwidth bound: the figure of merit is K/V bytes read per second as a fraction of
the measured copy bandwidth (target >= 70% at batch 64, contexts 4K and 32K). Prefill is
compute bound: FLOP/s against the measured bf16 GEMM rate. Every case is compared with plain
PyTorch SDPA over contiguous K/V (its best case: the page gather is not timed) and, where the
paged layout has to be gathered first, with gather + SDPA; and with FlashAttention on the same
paged cache when it is installed. Block tables are random permutations, so pages are scattered.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from perf.conftest import cuda_time_ms, record, requires_cuda
from rlt_kernels import attention
from rlt_kernels.attention import new_attention_workspace, paged_attention
from rlt_kernels.flash import flash_available
from rlt_kernels.flash import paged_attention as flash_paged_attention

pytestmark = requires_cuda

OURO = dict(heads=16, kv_heads=16, head_dim=128)
HUGINN = dict(heads=55, kv_heads=55, head_dim=96)


def paged_case(batch, context, q_len, *, heads, kv_heads, head_dim, block_size=16, dtype=torch.bfloat16):
    """A batch of `batch` sequences with `context` keys each (their last `q_len` are queries),
    in a paged cache of exactly the blocks they use, scattered at random."""
    per_seq = -(-context // block_size)
    num_blocks = batch * per_seq
    k_cache = torch.empty(num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device="cuda").normal_()
    v_cache = torch.empty_like(k_cache).normal_()
    tables = torch.randperm(num_blocks, device="cuda").int().view(batch, per_seq)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q_len
    q = torch.randn(batch * q_len, heads, head_dim, dtype=dtype, device="cuda")
    return q, k_cache, v_cache, tables, seq_lens, qsl


def kv_bytes(batch, context, kv_heads, head_dim, dtype=torch.bfloat16):
    return 2 * batch * context * kv_heads * head_dim * torch.finfo(dtype).bits // 8


def causal_flops(batch, context, q_len, heads, head_dim):
    """2 GEMMs (QK^T and PV) x 2 FLOP per multiply-add over the visible (query, key) pairs."""
    pairs = sum(context - q_len + i + 1 for i in range(q_len))
    return 4 * batch * heads * head_dim * pairs


def contiguous_kv(k_cache, v_cache, tables, heads):
    """Gather the paged cache into [B, H, context, D] (GQA heads repeated) for SDPA."""
    b = tables.shape[0]
    k = k_cache[tables.long()].flatten(1, 2)  # [B, context, KVH, D]
    v = v_cache[tables.long()].flatten(1, 2)
    group = heads // k.shape[2]
    k = k.repeat_interleave(group, dim=2) if group > 1 else k
    v = v.repeat_interleave(group, dim=2) if group > 1 else v
    return k.transpose(1, 2).reshape(b, heads, -1, k.shape[-1]), v.transpose(1, 2).reshape(b, heads, -1, v.shape[-1])


def timed(benchmark, fn):
    """Let pytest-benchmark keep its own (synchronised) statistics, then time with CUDA events."""
    def synced():
        fn()
        torch.cuda.synchronize()

    benchmark.pedantic(synced, rounds=5, warmup_rounds=1)
    return cuda_time_ms(fn)


def workspace_for(q, tables, block_size, split_size=None):
    return new_attention_workspace(q.shape[0], q.shape[1], q.shape[2], tables.shape[1] * block_size,
                                   split_size=split_size, device="cuda")


@pytest.mark.parametrize("batch,context,shape", [
    (64, 4096, "ouro"), (64, 32768, "ouro"), (4, 65536, "ouro"), (64, 4096, "huginn"),
])
def test_decode(benchmark, roofline, batch, context, shape):
    dims = OURO if shape == "ouro" else HUGINN
    q, k_cache, v_cache, tables, seq_lens, qsl = paged_case(batch, context, 1, **dims)
    out = torch.empty_like(q)
    ws = workspace_for(q, tables, k_cache.shape[1])
    ms = timed(benchmark, lambda: paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, out=out, workspace=ws,
                                                  decode_from=0))
    tile_ms = cuda_time_ms(lambda: paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, out=torch.empty_like(q),
                                                   workspace=ws))

    qb = q.view(batch, 1, dims["heads"], -1).transpose(1, 2)  # [B, H, 1, D]
    gather_sdpa_ms = cuda_time_ms(
        lambda: F.scaled_dot_product_attention(qb, *contiguous_kv(k_cache, v_cache, tables, dims["heads"])),
        warmup=2, iters=5)
    k, v = contiguous_kv(k_cache, v_cache, tables, dims["heads"])
    sdpa_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(qb, k, v))
    ref = F.scaled_dot_product_attention(qb, k, v).transpose(1, 2).reshape_as(out)
    del k, v
    max_err = (out.float() - ref.float()).abs().max().item()
    extra = {}
    if flash_available():
        try:
            flash_ms = cuda_time_ms(lambda: flash_paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl))
            extra.update(flash_ms=flash_ms, speedup_vs_flash=flash_ms / ms)
        except ValueError as err:  # FA2 needs block_size % 256 == 0
            extra.update(flash_skipped=str(err))
    record(benchmark, roofline, name=f"decode_{shape}_b{batch}_ctx{context}", ms=ms,
           bytes_moved=kv_bytes(batch, context, dims["kv_heads"], dims["head_dim"]),
           baseline_ms=sdpa_ms, baseline="sdpa_contiguous_kv", gather_sdpa_ms=gather_sdpa_ms,
           speedup_vs_gather_sdpa=gather_sdpa_ms / ms, max_abs_err_vs_sdpa=max_err, tile_kernel_ms=tile_ms, **extra)


@pytest.mark.parametrize("batch", [1, 8])
def test_prefill(benchmark, roofline, batch):
    """Causal prefill of 2K-token prompts (one chunk per sequence, no earlier context)."""
    context = q_len = 2048
    q, k_cache, v_cache, tables, seq_lens, qsl = paged_case(batch, context, q_len, **OURO)
    out = torch.empty_like(q)
    ms = timed(benchmark, lambda: paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, out=out))

    qb = q.view(batch, q_len, OURO["heads"], -1).transpose(1, 2)
    k, v = contiguous_kv(k_cache, v_cache, tables, OURO["heads"])
    sdpa_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(qb, k, v, is_causal=True))
    ref = F.scaled_dot_product_attention(qb, k, v, is_causal=True).transpose(1, 2).reshape_as(out)
    extra = {}
    if flash_available():
        try:
            flash_ms = cuda_time_ms(lambda: flash_paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl))
            extra.update(flash_ms=flash_ms, speedup_vs_flash=flash_ms / ms)
        except ValueError as err:
            extra.update(flash_skipped=str(err))
    record(benchmark, roofline, name=f"prefill_ouro_b{batch}_2k", ms=ms,
           flops=causal_flops(batch, context, q_len, OURO["heads"], OURO["head_dim"]),
           baseline_ms=sdpa_ms, baseline="sdpa_causal_contiguous",
           max_abs_err_vs_sdpa=(out.float() - ref.float()).abs().max().item(), **extra)


@pytest.mark.skipif(not flash_available(), reason="flash-attn is not installed")
@pytest.mark.parametrize("batch,context,q_len", [(64, 4096, 1), (4, 65536, 1), (1, 2048, 2048)])
def test_against_flash_block_256(benchmark, roofline, batch, context, q_len):
    """The same paged cache with 256-token blocks (FlashAttention 2's minimum page size)."""
    q, k_cache, v_cache, tables, seq_lens, qsl = paged_case(batch, context, q_len, block_size=256, **OURO)
    out = torch.empty_like(q)
    ws = workspace_for(q, tables, 256)
    ms = timed(benchmark, lambda: paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, out=out, workspace=ws))
    flash_ms = cuda_time_ms(lambda: flash_paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl))
    record(benchmark, roofline, name=f"vs_flash_b{batch}_ctx{context}_q{q_len}", ms=ms,
           bytes_moved=kv_bytes(batch, context, OURO["kv_heads"], OURO["head_dim"]),
           flops=causal_flops(batch, context, q_len, OURO["heads"], OURO["head_dim"]),
           baseline_ms=flash_ms, baseline="flash_attn_paged", block_size=256)


def test_depth_aware_decode_overhead(benchmark, roofline):
    """LAST_EXITED indirection (per-key exit depth, 4 planes) against the plain read of one plane."""
    batch, context, planes = 64, 4096, 4
    q, k_cache, v_cache, tables, seq_lens, qsl = paged_case(batch, context, 1, **OURO)
    per_seq = tables.shape[1]
    num_blocks = k_cache.shape[0]
    plane_tables = torch.stack([tables] + [torch.randperm(num_blocks, device="cuda").int().view(batch, per_seq)
                                           for _ in range(planes - 1)])
    key_depth = torch.randint(0, planes, (num_blocks, k_cache.shape[1]), dtype=torch.int8, device="cuda")
    out = torch.empty_like(q)
    ws = workspace_for(q, tables, k_cache.shape[1])
    query_depth = torch.full((batch,), planes - 1, dtype=torch.int32, device="cuda")
    ms = timed(benchmark, lambda: paged_attention(q, k_cache, v_cache, plane_tables, seq_lens, qsl, out=out,
                                                  workspace=ws, query_depth=query_depth, key_depth=key_depth,
                                                  decode_from=0))
    plain_ms = cuda_time_ms(lambda: paged_attention(q, k_cache, v_cache, tables, seq_lens, qsl, out=out, workspace=ws,
                                                    decode_from=0))
    record(benchmark, roofline, name="decode_ouro_last_exited_b64_ctx4096", ms=ms,
           bytes_moved=kv_bytes(batch, context, OURO["kv_heads"], OURO["head_dim"]),
           baseline_ms=plain_ms, baseline="plain_one_plane")



def engine_decode_case(batch, context, planes=4, table_keys=4096, block_size=16):
    """Decode as the engine runs it: 4 planes, per-key depths (all full depth), query loop 3,
    block tables as wide as the model's context (so short batches split into key ranges)."""
    q, k_cache, v_cache, tables, seq_lens, qsl = paged_case(batch, context, 1, block_size=block_size, **OURO)
    width = table_keys // block_size
    num_blocks = k_cache.shape[0]
    plane_tables = torch.zeros(planes, batch, width, dtype=torch.int32, device="cuda")
    for p in range(planes):
        plane_tables[p, :, : tables.shape[1]] = torch.randperm(num_blocks, device="cuda").int().view(tables.shape)
    key_depth = torch.full((num_blocks, block_size), planes - 1, dtype=torch.int8, device="cuda")
    query_depth = torch.full((batch,), planes - 1, dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, plane_tables, seq_lens, qsl, dict(query_depth=query_depth, key_depth=key_depth)


@pytest.mark.skipif(os.environ.get("RLT_ATTN_SWEEP") != "1", reason="tuning sweep: set RLT_ATTN_SWEEP=1")
def test_tile_sweep(benchmark, roofline, monkeypatch):
    """Decode (engine-like: short contexts, 4 planes) and 2K prefill for every tile row count and,
    at 64 rows, every pipeline depth and warp count and smaller key ranges (`split_size`: more
    programs per sequence at small batches, a merge per range); `same_bits` says whether the
    output equals the default configuration's bit for bit (pipeline depth never changes the
    arithmetic; the key-range size does)."""
    cases = {f"decode_b{b}_ctx{c}": engine_decode_case(b, c) for b, c in ((1, 192), (64, 192), (256, 192), (256, 1024))}
    q, k, v, t, sl, qsl = paged_case(1, 2048, 2048, **OURO)
    cases["prefill_b1_2k"] = (q, k, v, t, sl, qsl, {})
    tile_shape = attention._tile_shape
    variants = [(rows, None, None, None) for rows in (64, 32, 16)]
    variants += [(64, warps, stages, None) for warps in (4, 8) for stages in (1, 2, 3, 4)]
    variants += [(64, None, None, split) for split in (64, 128, 256)]
    results, reference = {}, {}
    for rows, warps, stages, split in variants:
        def shaped(*args, _warps=warps, _stages=stages, **kwargs):
            cfg = tile_shape(*args, **kwargs)
            cfg["num_warps"] = _warps or cfg["num_warps"]
            cfg["num_stages"] = _stages or cfg["num_stages"]
            return cfg
        monkeypatch.setattr(attention, "MIN_TILE_ROWS", rows)
        monkeypatch.setattr(attention, "_tile_shape", shaped)
        label = f"rows{rows}" + (f"_w{warps}_s{stages}" if warps else "") + (f"_split{split}" if split else "")
        for name, (q, k, v, t, sl, qsl, kw) in cases.items():
            out = torch.empty_like(q)
            ws = workspace_for(q, t[0] if t.dim() == 3 else t, k.shape[1], split)
            fn = lambda: paged_attention(q, k, v, t, sl, qsl, out=out, workspace=ws, split_size=split, **kw)  # noqa: E731
            try:
                ms = cuda_time_ms(fn)
            except Exception as exc:  # a configuration that does not compile or fit: record, go on
                results[f"{name}_{label}"] = {"error": str(exc)[:200]}
                continue
            fn()
            bits = out.view(torch.int16).clone()
            reference.setdefault(name, bits)  # the first variant is the default configuration
            nbytes = kv_bytes(q.shape[0], int(sl[0]), OURO["kv_heads"], OURO["head_dim"]) if "decode" in name else 0
            results[f"{name}_{label}"] = {"ms": ms, "gbps": nbytes / ms / 1e6 if nbytes else None,
                                          "same_bits": bool(torch.equal(bits, reference[name]))}
            print(name, label, results[f"{name}_{label}"])
    record(benchmark, roofline, name="attention tile sweep", ms=results["decode_b256_ctx192_rows64"]["ms"],
           sweep=results)
    benchmark.pedantic(lambda: torch.cuda.synchronize(), rounds=1)
