"""`rope_paged_attention`: RoPE, the K/V write and decode attention in one launch, against the two
kernels it replaces (same bits: output and both caches) and the torch reference."""

from __future__ import annotations

import pytest
import torch

from rlt_kernels import attention, kv_cache, norms
from rlt_kernels.attention import new_range_counters, rope_paged_attention, rope_paged_attention_reference
from rlt_kernels.fp8 import FP8_DTYPE

from checks import assert_same_bits, randn, seeded

BLOCK = 16
PLANES = 3  # planes 0..2, one per loop; the query runs loop 2 and writes plane 2


def decode_pass(seq_lens, *, heads, kv_heads, head_dim, dtype, device, cache_dtype=None, bias=False,
                negative_slot=None, seed=0, table_blocks=None):
    """A decode pass over sequences of ``seq_lens`` keys (their last key the query's own token):
    paged caches whose keys before each query are filled (every plane, through a key-depth table
    that sends some keys to earlier planes), whose own slots hold poison the pass must overwrite;
    ``negative_slot``: that row's slot is -1 (nothing written: its own slot keeps a valid value);
    ``table_blocks``: tables that wide (unused entries -1), as the engine's graphs capture them."""
    g = seeded(seed, device)
    s = len(seq_lens)
    per_seq = max(-(-n // BLOCK) for n in seq_lens) + 1
    num_blocks = PLANES * s * per_seq + 2
    cache_dtype = dtype if cache_dtype is None else cache_dtype
    k_cache = randn((num_blocks, BLOCK, kv_heads, head_dim), dtype, device, g)
    v_cache = randn((num_blocks, BLOCK, kv_heads, head_dim), dtype, device, g)
    tables = torch.randperm(num_blocks, generator=g, device=device)[: PLANES * s * per_seq].view(PLANES, s, per_seq)
    tables = tables.to(torch.int32)
    if table_blocks is not None:
        wide = torch.full((PLANES, s, table_blocks), -1, dtype=torch.int32, device=device)
        wide[:, :, :per_seq] = tables
        tables = wide
    tables = tables.contiguous()
    positions = torch.tensor([n - 1 for n in seq_lens], dtype=torch.int64, device=device)
    rows = torch.arange(s, device=device)
    slots = tables[PLANES - 1, rows, positions // BLOCK].long() * BLOCK + positions % BLOCK
    if negative_slot is not None:
        slots[negative_slot] = -1
    # Poison each written slot so a missing write shows (the -1 row keeps a value it must not lose).
    for i in range(s):
        if i != negative_slot:
            blk, off = divmod(int(slots[i]), BLOCK)
            k_cache[blk, off] = float("nan")
            v_cache[blk, off] = float("nan")
    scales = {}
    if cache_dtype == FP8_DTYPE:
        scales = dict(k_scale=torch.rand(kv_heads, generator=g, device=device) + 0.5,
                      v_scale=torch.rand(kv_heads, generator=g, device=device) + 0.5)
        k_cache = k_cache.nan_to_num(0.0).float().clamp(-400, 400).to(FP8_DTYPE)
        v_cache = v_cache.nan_to_num(0.0).float().clamp(-400, 400).to(FP8_DTYPE)
    return dict(
        q=randn((s, heads, head_dim), dtype, device, g), k=randn((s, kv_heads, head_dim), dtype, device, g),
        v=randn((s, kv_heads, head_dim), dtype, device, g), positions=positions,
        cos_sin=norms.rope_cos_sin(max(seq_lens), head_dim, 10000.0, device=device), k_cache=k_cache, v_cache=v_cache,
        slot_mapping=slots, block_tables=tables, seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(s + 1, dtype=torch.int32, device=device),
        q_bias=randn((heads, head_dim), dtype, device, g) if bias else None,
        k_bias=randn((kv_heads, head_dim), dtype, device, g) if bias else None,
        attention=dict(query_depth=PLANES - 1,
                       key_depth=torch.randint(0, PLANES, (num_blocks, BLOCK), generator=g, device=device,
                                               dtype=torch.int32)),
        scales=scales,
    )


def clone_caches(p):
    return dict(p, k_cache=p["k_cache"].clone(), v_cache=p["v_cache"].clone())


def fused(p, style, **kw):
    return rope_paged_attention(
        p["q"], p["k"], p["v"], p["positions"], p["cos_sin"], p["k_cache"], p["v_cache"], p["slot_mapping"],
        p["block_tables"], p["seq_lens"], p["query_start_loc"], style=style, q_bias=p["q_bias"], k_bias=p["k_bias"],
        **p["attention"], **p["scales"], **kw)


def reference(p, style, **kw):
    return rope_paged_attention_reference(
        p["q"], p["k"], p["v"], p["positions"], p["cos_sin"], p["k_cache"], p["v_cache"], p["slot_mapping"],
        p["block_tables"], p["seq_lens"], p["query_start_loc"], style=style, q_bias=p["q_bias"], k_bias=p["k_bias"],
        **p["attention"], **p["scales"], **kw)


def two_kernels(p, style, active_seqs=None, **kw):
    q_rot = kv_cache.rope_kv_scatter(p["q"], p["k"], p["v"], p["positions"], p["cos_sin"], p["k_cache"], p["v_cache"],
                                     p["slot_mapping"], style=style, q_bias=p["q_bias"], k_bias=p["k_bias"],
                                     active_rows=active_seqs, **p["scales"])
    return attention.paged_attention(q_rot, p["k_cache"], p["v_cache"], p["block_tables"], p["seq_lens"],
                                     p["query_start_loc"], decode_from=0, active_seqs=active_seqs, **p["attention"],
                                     **p["scales"], **kw)


CASES = {  # name: (decode_pass kwargs, style, launch kwargs)
    "bf16 neox MHA": (dict(heads=2, kv_heads=2, head_dim=64, dtype=torch.bfloat16), "neox", {}),
    "fp32 gptj GQA bias head_dim 48": (dict(heads=4, kv_heads=2, head_dim=48, dtype=torch.float32, bias=True),
                                       "gptj", {}),
    "bf16 split ranges": (dict(heads=2, kv_heads=1, head_dim=32, dtype=torch.bfloat16), "neox", dict(split_size=64)),
    "fp8 cache": (dict(heads=2, kv_heads=2, head_dim=32, dtype=torch.bfloat16, cache_dtype=FP8_DTYPE), "neox", {}),
    "negative slot, inactive rows": (dict(heads=2, kv_heads=1, head_dim=32, dtype=torch.float32, negative_slot=1),
                                     "neox", dict(active_seqs=3)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fused_pass_gives_the_two_kernels_bits(device, name):
    check_fused_pass(device, *CASES[name])


@pytest.mark.parametrize("programs", [1, 2, 3])
def test_split_rows_write_their_own_key_once(device, monkeypatch, programs):
    """Split launches (3 key ranges in the longest row): whichever range program takes a row's
    last range writes its own key, with 1, 2 or 3 range programs per row."""
    monkeypatch.setattr(attention, "_sm_count", lambda dev: 8)  # splits on the CPU too
    monkeypatch.setattr(attention, "_decode_range_programs", lambda rows, n, dev: min(n, programs))
    check_fused_pass(device, dict(heads=2, kv_heads=1, head_dim=32, dtype=torch.bfloat16), "neox",
                     dict(split_size=64))


def test_fuller_launches_run_the_two_kernels(device, monkeypatch):
    """Launches of FUSED_ROPE_BELOW_PROGRAMS_PER_SM or more (token, KV head) programs per SM over
    a bf16 or fp32 cache keep `rope_kv_scatter` before the attention (full launches lose more to
    the fused prologue than the scatter kernel costs); over an FP8 cache every launch fuses: the
    rule, and the same bits from the fallback."""
    monkeypatch.setattr(attention, "_sm_count", lambda dev: 132)
    per_sm = attention.FUSED_ROPE_BELOW_PROGRAMS_PER_SM
    assert per_sm == 8  # Ouro's batch 64 (1,024 programs on 132 SMs) fuses, batch 128 does not
    assert attention._fuses_rope(per_sm * 132 - 1, torch.device(device))
    assert not attention._fuses_rope(per_sm * 132, torch.device(device))
    assert attention._fuses_rope(256 * 16, torch.device(device), kv_fp8=True)  # Ouro's batch 256, FP8 cache
    monkeypatch.setattr(attention, "FUSED_ROPE_EVERY_FP8_LAUNCH", False)
    assert not attention._fuses_rope(256 * 16, torch.device(device), kv_fp8=True)
    launches = []
    real = attention._attention
    monkeypatch.setattr(attention, "_attention", lambda *a, **kw: launches.append(kw.get("rope")) or real(*a, **kw))
    p = decode_pass([5, 40, 70], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32, device=device)
    a, b = clone_caches(p), clone_caches(p)
    monkeypatch.setattr(attention, "_sm_count", lambda dev: 1)
    monkeypatch.setattr(attention, "FUSED_ROPE_BELOW_PROGRAMS_PER_SM", 3)  # 3 programs: 3 per SM, the two kernels
    out_two = fused(a, "neox")
    monkeypatch.setattr(attention, "_sm_count", lambda dev: 0)  # the interpreter's rule: fused
    out_fused = fused(b, "neox")
    assert launches[0] is None and launches[1] is not None
    assert_same_bits(out_two, out_fused)
    assert_same_bits(a["k_cache"], b["k_cache"])


def check_fused_pass(device, setup, style, kw):
    seq_lens = [1, 17, 64, 65, 150]
    p = decode_pass(seq_lens, device=device, **setup)
    kw = dict(kw)
    active = kw.pop("active_seqs", None)
    if active is not None:
        kw["active_seqs"] = torch.tensor([active], dtype=torch.int32, device=device)
    if kw.get("split_size"):  # several key ranges per row, merged in place by the last range program
        kw.update(workspace=attention.new_attention_workspace(len(seq_lens), setup["heads"], setup["head_dim"],
                                                              p["block_tables"].shape[-1] * BLOCK, device=device,
                                                              split_size=kw["split_size"]),
                  range_counters=new_range_counters(device))
    a, b = clone_caches(p), clone_caches(p)
    out_fused = fused(a, style, **kw)
    out_two = two_kernels(b, style, **kw)
    live = len(seq_lens) if active is None else active
    assert_same_bits(out_fused[:live], out_two[:live])
    assert_same_bits(a["k_cache"], b["k_cache"])
    assert_same_bits(a["v_cache"], b["v_cache"])
    c = clone_caches(p)
    ref_kw = {k: v for k, v in kw.items() if k not in ("workspace", "range_counters")}
    ref = reference(c, style, **ref_kw)
    tol = 2e-2 if setup["dtype"] == torch.bfloat16 else 2e-5
    if torch.device(device).type == "cuda" or setup["dtype"] == torch.float32:
        assert_same_bits(a["k_cache"], c["k_cache"])  # the rotation rounds as the reference does
    else:  # the interpreter rounds fp32 -> bf16 its own way (rope_kv_scatter's too): one bf16 (or e4m3) step
        step = 0.13 if setup.get("cache_dtype") == FP8_DTYPE else tol
        torch.testing.assert_close(a["k_cache"].float(), c["k_cache"].float(), atol=step, rtol=step)
    assert_same_bits(a["v_cache"], c["v_cache"])
    torch.testing.assert_close(out_fused[:live].float(), ref[:live].float(), atol=tol, rtol=tol)
    assert not out_fused[:live].isnan().any()


def test_fused_pass_validates_its_inputs(device):
    p = decode_pass([5, 9], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="one query per sequence"):
        rope_paged_attention(p["q"], p["k"], p["v"], p["positions"], p["cos_sin"], p["k_cache"], p["v_cache"],
                             p["slot_mapping"], p["block_tables"], p["seq_lens"][:1], p["query_start_loc"][:2])
    with pytest.raises(ValueError, match="style"):
        fused(p, "half")
    with pytest.raises(ValueError, match="decode_from"):
        fused(p, "neox", decode_from=0)
    with pytest.raises(ValueError, match="positions"):
        rope_paged_attention(p["q"], p["k"], p["v"], p["positions"][:1], p["cos_sin"], p["k_cache"], p["v_cache"],
                             p["slot_mapping"], p["block_tables"], p["seq_lens"], p["query_start_loc"])


def test_rows_of_one_sequence_are_refused_on_the_cpu(device):
    """Live rows that share a sequence slot would read keys another program of the fused launch
    writes (nothing orders that write first on a GPU): the CPU paths, references included, refuse
    them, so a caller that passes such rows fails in the CPU suite. Padding rows past the live count
    may repeat a slot; on the GPU nothing is checked (it would need a device sync)."""
    p = decode_pass([5, 9, 7], heads=2, kv_heads=1, head_dim=32, dtype=torch.float32, device=device)
    shared = torch.tensor([0, 1, 0], dtype=torch.int32, device=device)
    calls = (fused, reference) if device.type == "cpu" else ()
    for call in calls:
        with pytest.raises(ValueError, match=r"share seq_slots \[0, 1, 0\]"):
            call(clone_caches(p), "neox", seq_slots=shared)
        two_live = torch.tensor([2], dtype=torch.int32, device=device)
        got = call(clone_caches(p), "neox", active_seqs=two_live, seq_slots=shared)
        if call is fused:
            want = two_kernels(clone_caches(p), "neox", active_seqs=two_live, seq_slots=shared)
            assert torch.equal(got[:2], want[:2])


def _fused_against_two_kernels(p, style, runs, **kw):
    """The fused launch over fresh copies of pass p, ``runs`` times: each time the two kernels'
    output bits and caches; then the two kernels' key cache against the reference's. Returns the
    two kernels' output, the reference's, and the two kernels' and the reference's caches."""
    b = clone_caches(p)
    expected = two_kernels(b, style, **kw)
    for _ in range(runs):
        a = clone_caches(p)
        assert_same_bits(fused(a, style, **kw), expected)
        assert_same_bits(a["k_cache"], b["k_cache"])
        assert_same_bits(a["v_cache"], b["v_cache"])
    c = clone_caches(p)
    ref = reference(c, style)
    assert_same_bits(b["k_cache"], c["k_cache"])
    return expected, ref, (b, c)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 16])
@pytest.mark.parametrize("shape", ["ouro bf16", "ouro fp8 cache", "huginn gptj bias", "huginn fp32 gptj bias"])
def test_fused_pass_on_gpu(batch, shape):
    """Engine shapes on the GPU (tables as wide as a 64K context, so these batches split their keys
    across range programs that run at once, and fuse): the fused launch gives the two kernels' bits, its
    caches the reference's, over repeated runs (a program that read its own key before it was
    written would show as poison)."""
    setup = {"ouro bf16": dict(heads=16, kv_heads=16, head_dim=128, dtype=torch.bfloat16),
             "ouro fp8 cache": dict(heads=16, kv_heads=16, head_dim=128, dtype=torch.bfloat16, cache_dtype=FP8_DTYPE),
             "huginn gptj bias": dict(heads=8, kv_heads=8, head_dim=96, dtype=torch.bfloat16, bias=True),
             "huginn fp32 gptj bias": dict(heads=8, kv_heads=8, head_dim=96, dtype=torch.float32, bias=True)}[shape]
    style = "gptj" if "gptj" in shape else "neox"
    g = torch.Generator().manual_seed(batch)
    seq_lens = torch.randint(1, 2100, (batch,), generator=g).tolist()
    p = decode_pass(seq_lens, device="cuda", table_blocks=65536 // BLOCK, seed=batch, **setup)
    kw = dict(workspace=attention.new_attention_workspace(batch, setup["heads"], setup["head_dim"], 65536,
                                                          device="cuda"),
              range_counters=new_range_counters("cuda"))
    expected, _, _ = _fused_against_two_kernels(p, style, 5, **kw)
    assert not expected.isnan().any()


@pytest.mark.gpu
def test_fused_full_fp8_launch_on_gpu():
    """Ouro's shape over an FP8 cache at batch 256: 4,096 (token, KV head) programs of one warp, an
    unsplit launch that fuses (FUSED_ROPE_EVERY_FP8_LAUNCH).
    It gives the two kernels' bits over repeated runs, the reference's caches, and an output close
    to the reference's."""
    setup = dict(heads=16, kv_heads=16, head_dim=128, dtype=torch.bfloat16, cache_dtype=FP8_DTYPE)
    batch, device = 256, torch.device("cuda")
    programs = batch * setup["kv_heads"]
    assert attention._fuses_rope(programs, device, kv_fp8=True)
    assert attention._decode_shape(16, 16, 128, kv_fp8=True)["num_warps"] == 1
    g = torch.Generator().manual_seed(batch)
    seq_lens = torch.randint(1, 300, (batch,), generator=g).tolist()
    p = decode_pass(seq_lens, device="cuda", seed=batch, **setup)
    expected, ref, (b, c) = _fused_against_two_kernels(p, "neox", 3)
    assert_same_bits(b["v_cache"], c["v_cache"])
    torch.testing.assert_close(expected.float(), ref.float(), atol=2e-2, rtol=2e-2)
    assert not expected.isnan().any()


@pytest.mark.gpu
def test_fused_pass_keeps_subnormals_on_gpu():
    """fp32 q and k so small that their rotated products fall below fp32's smallest normal: the
    fused launch keeps those subnormals, as the RoPE kernel (compiled without contraction) and the
    torch reference do, in the cache and the output. A fused rotation through libdevice's
    round-to-nearest operations flushed them to zero."""
    p = decode_pass([40, 75, 130], heads=2, kv_heads=2, head_dim=64, dtype=torch.float32, device="cuda", seed=3)
    p["q"] *= 1e-37
    p["k"] *= 1e-37
    b = clone_caches(p)
    expected = two_kernels(b, "neox")
    a = clone_caches(p)
    assert_same_bits(fused(a, "neox"), expected)
    assert_same_bits(a["k_cache"], b["k_cache"])
    c = clone_caches(p)
    reference(c, "neox")
    assert_same_bits(b["k_cache"], c["k_cache"])
    written = a["k_cache"].view(-1, 2, 64)[p["slot_mapping"]]
    assert ((written != 0) & (written.abs() < torch.finfo(torch.float32).tiny)).any()  # the case is exercised
