"""KV scatter, fused RoPE + KV scatter, row routing, cache slots and the LAST_EXITED finalize copy.

Run on a GPU: ``pytest perf/test_bench_kv_routing.py --benchmark-json=out/kv_routing.json``.

Bytes moved count what a perfect kernel must move: every input byte read once and every
output byte written once (K/V rows, q, index and cos/sin rows; finalize reads each source
token once per layer and writes it to each deeper plane). Times are medians of CUDA events
around replays of a CUDA graph holding ``GRAPH_CALLS`` back-to-back calls, divided by that
count: the engine runs these kernels inside graphs, so Python launch overhead is left out
(the eager time is recorded too). Transfers under ``LATENCY_BYTES`` are latency-bound and are
reported as microseconds (``regime: latency``); larger ones as a fraction of the measured
copy bandwidth (target >= 60%). The baselines are plain torch: index_put_ / index_select /
advanced indexing, and the torch RoPE reference for the fused kernel.
"""

import pytest
import torch

from perf.conftest import cuda_time_ms, record, requires_cuda
from rlt_kernels import block_tables, kv_cache, routing
from rlt_kernels.norms import apply_rope_reference, rope_cos_sin

pytestmark = requires_cuda

# heads, kv_heads, head_dim, block_size, rope style, q/k bias
MODELS = {"ouro": (16, 16, 128, 16, "neox", False), "huginn": (55, 55, 96, 128, "gptj", True)}
TOKENS = [1, 64, 256, 4096]
GRAPH_CALLS = 20
LATENCY_BYTES = 16 << 20
DTYPE = torch.bfloat16


def _graph_ms(fn) -> float:
    """Per-call device time of fn from a replayed CUDA graph of GRAPH_CALLS calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_CALLS):
            fn()
    ms = cuda_time_ms(graph.replay) / GRAPH_CALLS
    del graph
    return ms


def _measure(benchmark, roofline, name, fn, baseline, bytes_moved, **extra):
    benchmark.pedantic(lambda: (fn(), torch.cuda.synchronize()), rounds=10, warmup_rounds=2)
    ms = _graph_ms(fn)
    baseline_ms = _graph_ms(baseline)
    info = record(
        benchmark, roofline, name=name, ms=ms, bytes_moved=bytes_moved, baseline_ms=baseline_ms,
        regime="bandwidth" if bytes_moved >= LATENCY_BYTES else "latency", latency_us=ms * 1e3,
        eager_ms=cuda_time_ms(fn), baseline_eager_ms=cuda_time_ms(baseline),
        baseline_frac_bandwidth=bytes_moved / (baseline_ms * 1e-3) / 1e9 / roofline["copy_gbps"], **extra,
    )
    print(f"{name}: {ms * 1e3:.1f} us, {info['gbps']:.0f} GB/s ({info['frac_bandwidth']:.0%} of copy), "
          f"{info['speedup_vs_baseline']:.2f}x torch [{info['regime']}]")


def _kv_inputs(model, tokens, seed):
    _, kv_heads, head_dim, block_size, _, _ = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    num_blocks = 4 * tokens // block_size + 64
    k = torch.randn((tokens, kv_heads, head_dim), generator=gen, device="cuda").to(DTYPE)
    v = torch.randn((tokens, kv_heads, head_dim), generator=gen, device="cuda").to(DTYPE)
    k_cache = torch.zeros((num_blocks, block_size, kv_heads, head_dim), dtype=DTYPE, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(num_blocks * block_size, generator=gen, device="cuda")[:tokens]
    return k, v, k_cache, v_cache, slots


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("model", list(MODELS))
def test_bench_kv_scatter(benchmark, roofline, model, tokens):
    k, v, k_cache, v_cache, slots = _kv_inputs(model, tokens, tokens)
    flat_k, flat_v = k_cache.view(-1, *k.shape[1:]), v_cache.view(-1, *v.shape[1:])

    def run():
        kv_cache.kv_scatter(k, v, k_cache, v_cache, slots)

    def baseline():
        flat_k.index_put_((slots,), k)
        flat_v.index_put_((slots,), v)

    run()
    assert torch.equal(flat_k[slots], k) and torch.equal(flat_v[slots], v)
    bytes_moved = 4 * k.numel() * k.element_size() + slots.numel() * slots.element_size()
    _measure(benchmark, roofline, f"kv_scatter/{model}/T{tokens}", run, baseline, bytes_moved, tokens=tokens)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("model", list(MODELS))
def test_bench_rope_kv_scatter(benchmark, roofline, model, tokens):
    heads, kv_heads, head_dim, _, style, bias = MODELS[model]
    k, v, k_cache, v_cache, slots = _kv_inputs(model, tokens, tokens + 1)
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    q = torch.randn((tokens, heads, head_dim), generator=gen, device="cuda").to(DTYPE)
    q_out = torch.empty_like(q)
    positions = torch.randint(0, 8192, (tokens,), generator=gen, device="cuda")
    cos_sin = rope_cos_sin(8192, head_dim, 10000.0, device="cuda")
    q_bias = torch.randn((heads, head_dim), device="cuda").to(DTYPE) if bias else None
    k_bias = torch.randn((kv_heads, head_dim), device="cuda").to(DTYPE) if bias else None
    flat_k, flat_v = k_cache.view(-1, kv_heads, head_dim), v_cache.view(-1, kv_heads, head_dim)

    def run():
        kv_cache.rope_kv_scatter(q, k, v, positions, cos_sin, k_cache, v_cache, slots,
                                 style=style, q_bias=q_bias, k_bias=k_bias, q_out=q_out)

    def baseline():
        apply_rope_reference(q, positions, cos_sin, style=style, bias=q_bias, out=q_out)
        flat_k.index_put_((slots,), apply_rope_reference(k, positions, cos_sin, style=style, bias=k_bias))
        flat_v.index_put_((slots,), v)

    run()  # sanity only: tests/kernels/test_kv_cache.py checks the bits
    expected_k = apply_rope_reference(k, positions, cos_sin, style=style, bias=k_bias)
    torch.testing.assert_close(q_out, apply_rope_reference(q, positions, cos_sin, style=style, bias=q_bias))
    torch.testing.assert_close(flat_k[slots], expected_k)
    assert torch.equal(flat_v[slots], v)
    element = q.element_size()
    bytes_moved = (
        2 * q.numel() * element + 4 * k.numel() * element
        + tokens * (head_dim * cos_sin.element_size() + positions.element_size() + slots.element_size())
    )
    _measure(benchmark, roofline, f"rope_kv_scatter/{model}/T{tokens}", run, baseline, bytes_moved,
             tokens=tokens, style=style)


@pytest.mark.parametrize("rows", [64, 256])
@pytest.mark.parametrize("width", [2048, 5280])
@pytest.mark.parametrize("op", ["gather", "scatter"])
def test_bench_route_rows(benchmark, roofline, op, width, rows):
    pool_rows = 1024
    gen = torch.Generator(device="cuda").manual_seed(width + rows)
    pool = torch.randn((pool_rows, width), generator=gen, device="cuda").to(DTYPE)
    batch = torch.randn((rows, width), generator=gen, device="cuda").to(DTYPE)
    index = torch.randperm(pool_rows, generator=gen, device="cuda")[:rows]

    if op == "gather":
        def run():
            routing.gather_rows(pool, index, out=batch)

        def baseline():
            torch.index_select(pool, 0, index, out=batch)

        run()
        assert torch.equal(batch, pool[index])
    else:
        def run():
            routing.scatter_rows(batch, index, pool)

        def baseline():
            pool.index_put_((index,), batch)

        run()
        assert torch.equal(pool[index], batch)
    bytes_moved = 2 * batch.numel() * batch.element_size() + index.numel() * index.element_size()
    _measure(benchmark, roofline, f"{op}_rows/W{width}/M{rows}", run, baseline, bytes_moved, rows=rows, width=width)


@pytest.mark.parametrize("rows", [1, 256])
def test_bench_cache_slots(benchmark, roofline, rows):
    """A decode pass's slots in Ouro's 4 planes, tables as wide as a 65,536-key context (block size 16)."""
    planes, slots, width, block_size = 4, 512, 4096, 16
    gen = torch.Generator(device="cuda").manual_seed(rows)
    tables = torch.randint(0, 2**20, (planes, slots, width), generator=gen, device="cuda", dtype=torch.int32)
    token_slots = torch.randperm(slots, generator=gen, device="cuda")[:rows].to(torch.int32)
    positions = torch.randint(0, 4096, (rows,), generator=gen, device="cuda")
    out = torch.empty((planes, rows), dtype=torch.int64, device="cuda")

    def run():
        block_tables.cache_slots(tables, token_slots, positions, block_size, out=out)

    def baseline():  # the torch expression the engine ran before
        blocks = tables[:, token_slots.long(), torch.div(positions, block_size, rounding_mode="floor")]
        return torch.where(blocks >= 0, blocks.long() * block_size + positions % block_size, -1)

    run()
    assert torch.equal(out, baseline())
    bytes_moved = rows * (planes * (4 + 8) + 4 + 8)  # table entries read, slots written, token slots and positions
    _measure(benchmark, roofline, f"cache_slots/P{planes}/M{rows}", run, baseline, bytes_moved, rows=rows, planes=planes)


def test_bench_finalize_last_exited(benchmark, roofline):
    """Ouro 24 layers x 4 planes, 256 rows exiting at plane 0 (three copies each), 16 x 128."""
    layers, planes, rows, kv_heads, head_dim, block_size, blocks_per_row = 24, 4, 256, 16, 128, 16, 2
    num_blocks = planes * rows * blocks_per_row
    k_cache = torch.randn((layers, num_blocks, block_size, kv_heads, head_dim), device="cuda").to(DTYPE)
    v_cache = torch.randn_like(k_cache)
    block_tables = torch.randperm(num_blocks, device="cuda").view(planes, rows, blocks_per_row).to(torch.int32)
    seq_slots = torch.arange(rows, device="cuda")
    positions = torch.randint(0, blocks_per_row * block_size, (rows,), device="cuda")
    exit_planes = torch.zeros(rows, dtype=torch.int64, device="cuda")
    logical, offsets = positions // block_size, positions % block_size
    src_blocks = block_tables[0, seq_slots, logical].long()
    dst_blocks = [block_tables[p, seq_slots, logical].long() for p in range(1, planes)]

    def run():
        routing.finalize_last_exited(k_cache, v_cache, block_tables, seq_slots, positions, exit_planes)

    def baseline():
        for cache in (k_cache, v_cache):
            token_rows = cache[:, src_blocks, offsets]
            for dst in dst_blocks:
                cache[:, dst, offsets] = token_rows

    run()
    for dst in dst_blocks:
        assert torch.equal(k_cache[:, dst, offsets], k_cache[:, src_blocks, offsets])
        assert torch.equal(v_cache[:, dst, offsets], v_cache[:, src_blocks, offsets])
    token_bytes = kv_heads * head_dim * k_cache.element_size()
    bytes_moved = 2 * layers * rows * token_bytes * planes  # per cache: 1 read + (planes - 1) writes
    _measure(benchmark, roofline, f"finalize_last_exited/L{layers}/P{planes}/M{rows}", run, baseline, bytes_moved,
             rows=rows, layers=layers, planes=planes)
