"""What the attention and linear kernels compile to for Hopper (sm_90), checked on any machine.

Triton compiles for a GPU target without one (`perf.sm90_resources`, run in a fresh process: the
suite's kernels run under the interpreter, which cannot compile). These tests read the global loads
in the PTX of the decode and tile attention kernels at Ouro's shape (16 x 128 heads, block size 16,
key-depth table), as the engine launches them: K/V tiles must move in 16-byte vectors. Without the
alignment hint on the key rows, Triton 3.9 read them 2 bytes per instruction (65 `ld.global.b16` per
key tile in the decode kernel) and left the tile kernel's K/V out of its copy pipeline. The linear
kernel over FP8 weights and the tile attention kernel over FP8 caches must widen their tiles with
`rlt_kernels/_widen.py`'s integer instructions,
not with Triton's cast (one slow f16 -> bf16 conversion per element, which set the pace of FP8
decode: docs/perf/fp8.md), and the decode kernel must read FP8 caches as words, with no per-byte
unpacking (64 `prmt` and 64 `cvt.u16.u32` per key tile had made it issue-bound). The linear kernel's middle and prefill tiles must move their tiles by TMA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from rlt_kernels import attention as attn

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# The compilations behind this module's fixtures: each runs perf.sm90_resources in a process of its own.
_CALLS = {
    "reports": "s.attention_reports()",
    # Ouro's qkv over FP8 weights at the decode (transposed) and prefill tiles.
    "fp8_linear": "{rows: s.linear_report(6144, 2048, None, rows, 'fp8')[1] for rows in (1, 2048)}",
    # Ouro's weights at the middle and prefill tiles (bf16), and down over FP8 weights at the prefill tile.
    "tma_linear": "{f'{name} {w} {rows}': s.linear_report(n, k, a, rows, w)[1] for name, n, k, a in s.OURO_WEIGHTS[:4] "
                  "for w in ('bf16', 'fp8') for rows in (256, 2048) if w == 'bf16' or (name, rows) == ('down', 2048)}",
    # The unsplit FP8 decode kernel of one query head per KV head (one warp, uncapped), with and without RoPE
    # and key depths (the key loop fixtures below read two of them).
    "decode_unsplit": "{f'rope {r} key depth {kd}': s.decode_attention_report('fp8', split=False, rope=r, key_depth=kd, "
                      "key_loop=True) for r in (False, True) for kd in (False, True)}",
    # Ouro's four layer weights at the 16- and 64-row transposed decode tiles, bf16 and FP8.
    "decode_linear": "{f'{name} {w} {rows}': s.linear_report(n, k, a, rows, w)[1] for name, n, k, a in "
                     "s.OURO_WEIGHTS[:4] for w in ('bf16', 'fp8') for rows in (1, 64)}",
}


def _start(call: str) -> subprocess.Popen:
    """perf.sm90_resources' `call` in a process without the interpreter, printing its JSON result."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = f"import json; from perf import sm90_resources as s; print(json.dumps({call}))"
    return subprocess.Popen([sys.executable, "-c", code], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen):
    out, err = proc.communicate(timeout=600)
    if proc.returncode != 0 and "GPUTarget" in err:
        pytest.skip("this Triton cannot compile for a target without its GPU")
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def compiled(request):
    """The compilations the collected tests of this module need, started together (on a cold
    Triton cache, as in CI, they take about a minute one after the other); name -> result,
    each waited for when first read."""
    needed = {name for item in request.session.items for name in getattr(item, "fixturenames", ()) if name in _CALLS}
    procs = {name: _start(_CALLS[name]) for name in sorted(needed)}
    results = {}

    def get(name):
        if name not in results:
            results[name] = _result(procs[name])
        return results[name]

    yield get
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.fixture(scope="module")
def reports(compiled) -> dict:
    return compiled("reports")


@pytest.fixture(scope="module")
def fp8_linear(compiled) -> dict:
    return compiled("fp8_linear")


@pytest.fixture(scope="module")
def tma_linear(compiled) -> dict:
    return compiled("tma_linear")


@pytest.fixture(scope="module")
def decode_linear(compiled) -> dict:
    return compiled("decode_linear")


@pytest.fixture(scope="module")
def decode_key_loop(decode_unsplit) -> dict:
    """The unsplit FP8 decode kernel's key loop (the SASS read by docs/perf/fp8.md's instruction counts)."""
    return decode_unsplit["rope False key depth True"]["key_loop"]


@pytest.fixture(scope="module")
def decode_unsplit(compiled) -> dict:
    return compiled("decode_unsplit")


def test_one_warp_fp8_decode_kernel_does_not_spill(decode_unsplit):
    """Over an FP8 cache with one query head per KV head the decode kernel runs one warp a program
    (`attention.decode_warps`), uncapped: Triton gives it up to 255 registers a thread, and ptxas
    must not spill, in the key loop or outside it (local-memory traffic on every key tile would
    undo the instructions the single warp saves). sm_90 SASS, Triton 3.6: 252-254 registers, no
    local-memory instruction, with and without RoPE and key depths."""
    assert attn.decode_warps(True, 1) == 1
    assert len(decode_unsplit) == 4
    for name, report in decode_unsplit.items():
        assert "error" not in report, (name, report)
        assert report["stack_bytes"] == 0 and report["key_loop"]["kernel_local_memory"] == 0, (name, report)


def test_decode_key_loop_is_found_in_the_sass(decode_key_loop):
    """The SASS reader finds the FP8 decode kernel's key loop: the innermost loop, whose
    instructions widen FP8 words (`F2FP` unpacks) and multiply-add them, not the outer range loop."""
    ops = dict(decode_key_loop["ops"])
    assert 50 < decode_key_loop["instructions"] < 2000
    assert decode_key_loop["kernel_instructions"] > decode_key_loop["instructions"] + 100  # prologue, fold, store
    assert ops.get("F2FP.F16.E4M3.UNPACK_B", 0) > 0 and ops.get("FFMA", 0) > 0


@pytest.fixture(scope="module")
def decode_engine_loop(decode_unsplit) -> dict:
    """The key loop of the FP8 decode kernel as full engine launches compile it (no key depths)."""
    return decode_unsplit["rope False key depth False"]["key_loop"]


def test_fp8_decode_key_loop_stays_short(decode_engine_loop):
    """The FP8 decode call at short contexts is bound by the instructions it issues (docs/perf/fp8.md,
    session 31), so its key loop is kept lean: one block id per key tile, K rows unmasked, tiles in
    pairs; and its code outside the loop runs on few warps. Counted in warp instructions a row (a
    thread's instructions times the warps): a lap of two 16-key tiles took 1,312 with 4 warps before
    those (1,368 with Triton 3.9), then 1,116 (1,164); with 2 warps 1,046 (1,130). Outside the loop a
    row issued about 3,300 with 4 warps, 1,706 (1,638) with 2, 874 with 1 (a lap 982). More than 1,240
    in the loop means per-key address work or one rescale per tile came back; more than 2,000 outside
    it, more warps."""
    warps = attn.decode_warps(True, 1)
    assert decode_engine_loop["instructions"] * warps <= 1240, decode_engine_loop
    outside = decode_engine_loop["kernel_instructions"] - decode_engine_loop["instructions"]
    assert outside * warps <= 2000, decode_engine_loop


def test_decode_tiles_fit_an_sm(decode_linear):
    """Every decode tile compiles for sm_90 within one SM's shared memory and without spills: a tile
    past the SM's shared memory compiles but fails at every launch (a weight-preloading experiment's
    64-row SwiGLU tile needed 245,760 bytes against 232,448)."""
    from rlt_kernels import gemm

    assert len(decode_linear) == 16
    for name, report in decode_linear.items():
        assert "error" not in report, (name, report)
        assert report["shared_bytes"] <= gemm.SM_SHARED_BYTES and report["stack_bytes"] == 0, (name, report)


def test_wide_decode_tiles_move_by_tma(decode_linear):
    """The 64-row transposed decode tiles of bf16 weights fetch x and the weight by TMA
    (`gemm.SKINNY_WIDE_TMA`, faster in the H200's decode chain at batch 64); the 16-row tiles, slower
    by TMA inside the chain, and FP8 weights' tiles keep per-thread copies."""
    for name, report in decode_linear.items():
        by_tma = report["loads"]["cp.async.bulk.tensor"] > 0
        assert by_tma == name.endswith("bf16 64"), (name, report["loads"])
        assert by_tma == (report["loads"]["cp.async.cg.shared.global"] == 0), (name, report["loads"])


def test_decode_attention_variants_compile_without_spills_in_the_key_loop(reports):
    """Split and unsplit decode kernels, with and without RoPE and the K/V write, bf16 and FP8 caches:
    no local memory in the key loop, at most a few instructions of it once a program (the split FP8
    kernel of 2 warps keeps 8 bytes there with Triton 3.6)."""
    variants = {name: r for name, r in reports.items() if name.startswith("decode attention")}
    assert len(variants) == 8 and sum("RoPE" in name for name in variants) == 4
    for name, report in variants.items():
        assert "error" not in report, (name, report)
        assert report["key_loop"]["local_memory"] == 0, (name, report["key_loop"])
        assert report["key_loop"]["kernel_local_memory"] <= 8, (name, report["key_loop"])


def test_decode_attention_keeps_subnormals(reports):
    """No decode variant rounds with fp32 arithmetic that flushes subnormals: the fused RoPE must
    round as the RoPE kernel (compiled without contraction, which keeps them) does. libdevice's
    round-to-nearest multiply and add, which it used before, compile to `mul.rn.ftz.f32` and
    `add.rn.ftz.f32` (four and two of them)."""
    variants = {name: r for name, r in reports.items() if name.startswith("decode attention")}
    for name, report in variants.items():
        assert report["flushing_arithmetic"] == 0, (name, report["flushing_arithmetic"])


def test_middle_and_prefill_tiles_move_by_tma(tma_linear):
    """The middle and prefill tiles fetch x and the weight with the tensor memory accelerator
    (`_linear_tma_kernel`), compile for sm_90 with this Triton, and neither spill nor fall back to
    per-thread copies."""
    assert len(tma_linear) == 9
    for name, report in tma_linear.items():
        assert "error" not in report, (name, report)
        assert report["loads"]["cp.async.bulk.tensor"] >= 2, (name, report)
        assert report["loads"]["cp.async.cg.shared.global"] == 0 and report["stack_bytes"] == 0, (name, report)
        assert report["wgmma"], (name, report)
    assert tma_linear["down fp8 2048"]["widening"]["cvt.bf16.f16"] == 0


@pytest.mark.parametrize("launch", ["split", "unsplit"])
@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_decode_kernel_reads_key_rows_in_16_byte_vectors(reports, cache, launch):
    warps = attn._decode_shape(16, 16, 128, kv_fp8=cache == "fp8")["num_warps"]
    loads = reports[f"decode attention {cache} depth-aware, {warps} warps, {launch}"]["loads"]
    assert loads["ld.global.v4.b32"] >= 4, loads  # K and V of the tiles in flight
    assert loads["ld.global.b16"] <= 1, loads  # q's load, nothing per key


@pytest.mark.parametrize("cache", ["bf16", "fp8"])
def test_tile_kernel_pipelines_key_rows_in_16_byte_copies(reports, cache):
    loads = reports[f"paged_attention {cache} depth-aware, 4 warps, 3 stages"]["loads"]
    assert loads["cp.async.cg.shared.global"] >= 8, loads  # K and V tiles staged 16 bytes per copy
    assert loads["ld.global.b16"] == 0, loads


@pytest.mark.parametrize("head_dim,aligned", [(128, True), (96, True), (64, True), (40, False), (20, False)])
def test_alignment_hint_only_where_every_key_row_is_aligned(head_dim, aligned):
    """The hint promises 16-element aligned key rows; a cache whose rows break that must not get it
    (on a GPU the vector loads would read the wrong elements)."""
    cache = torch.zeros(4, 16, 2, head_dim, dtype=torch.bfloat16)
    assert attn._kv_rows_aligned(cache) is aligned
    assert attn._kv_rows_aligned(cache[:, :, :1]) is aligned  # one head of a wider cache keeps its strides


@pytest.mark.parametrize("rows", ["1", "2048"])
def test_fp8_linear_widens_with_integer_instructions(fp8_linear, rows):
    widening = fp8_linear[rows]["widening"]
    assert widening["cvt.bf16.f16"] == 0, widening
    assert widening["fma.rn.bf16x2"] > 0, widening


@pytest.mark.parametrize("config", ["4 warps, 3 stages", "8 warps, 3 stages"])
def test_tile_attention_widens_fp8_keys_with_integer_instructions(reports, config):
    widening = reports[f"paged_attention fp8 depth-aware, {config}"]["widening"]
    assert widening["cvt.bf16.f16"] == 0, widening
    assert widening["fma.rn.bf16x2"] > 0, widening


@pytest.mark.parametrize("launch", ["split", "unsplit"])
def test_decode_attention_widens_fp8_words_without_byte_unpacking(reports, launch):
    widening = reports[f"decode attention fp8 depth-aware, {attn.decode_warps(True, 1)} warps, {launch}"]["widening"]
    assert widening["prmt.b32"] == 0 and widening["cvt.u16.u32"] == 0, widening
    assert widening["cvt.rn.f16x2.e4m3x2"] >= 4, widening  # K and V words of a key tile
