"""Attention reads the key-depth table only where a key may have left before the query's loop:
never at loop 0, never in prefill steps of prompt tokens alone, never in decode steps whose rows
all run every loop (their requests never exit early, so neither did any of their earlier tokens).
Speculative rounds follow the same rule. Where it does matter (loops past 0 of steps with rows that
may exit early, recomputed outputs), the engine reference tests check the results; this checks the
skips themselves, which only save work."""

from __future__ import annotations

from rlt_runtime import LLM, SamplingParams


def _attention_calls(llm: LLM, params: list[SamplingParams]) -> list[tuple]:
    """(query loop, key depths read, launch kind) of every attention call while generating."""
    runner = llm.engine.executor.worker.runner
    assert runner.layout.use_key_depth_reads
    calls = []
    attend, fused = runner.ops.paged_attention, runner.ops.rope_paged_attention

    def spied(*args, **kw):
        kind = "decode" if isinstance(kw["decode_from"], int) else "prefill"
        calls.append((kw["query_depth"], kw["key_depth"] is not None, kind))
        return attend(*args, **kw)

    def spied_fused(*args, **kw):  # decode passes: RoPE, the K/V write and attention in one op
        calls.append((kw["query_depth"], kw["key_depth"] is not None, "decode"))
        return fused(*args, **kw)

    runner.ops.paged_attention, runner.ops.rope_paged_attention = spied, spied_fused
    try:
        llm.generate(["a looped model", "depth", "the loop runs"][: len(params)], params, use_tqdm=False)
    finally:
        runner.ops.paged_attention, runner.ops.rope_paged_attention = attend, fused
    return calls


def test_key_depths_read_only_where_a_key_may_have_left_early():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4)
    depth = llm.engine.depth
    full = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    calls = _attention_calls(llm, [full, full])
    assert {kind for _, _, kind in calls} == {"decode", "prefill"}
    assert not any(reads for _, reads, _ in calls)  # prompt tokens and rows that never exit early

    early = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, exit_threshold=0.6)
    calls = _attention_calls(llm, [early, full])
    decode = [(t, reads) for t, reads, kind in calls if kind == "decode"]
    assert {t for t, _ in decode} == set(range(depth))
    assert all(reads == (t > 0) for t, reads in decode)
    assert not any(reads for _, reads, kind in calls if kind == "prefill")


def test_speculative_rounds_read_key_depths_only_with_rows_that_may_exit_early():
    """Drafts (loops 0..d-1) and verification (loops d..D-1) of requests that never exit early take
    the fixed path: no key-depth reads and no exit rule before the last loop. A round with such a
    row reads the table at every loop past 0, drafts and verification alike."""
    spec = {"num_speculative_tokens": 2, "draft_loops": 2, "draft_policy": "fixed"}
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec)
    depth = llm.engine.depth
    full = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    calls = _attention_calls(llm, [full, full])
    loops = {t for t, _, kind in calls if kind == "decode"}
    assert loops == set(range(depth))  # drafts and verification ran
    assert not any(reads for _, reads, _ in calls)

    early = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, exit_threshold=0.6)
    calls = _attention_calls(llm, [early, full])
    decode = [(t, reads) for t, reads, kind in calls if kind == "decode"]
    assert {t for t, reads in decode if reads} == set(range(1, depth))  # (rounds after it finished: fixed)
    assert not any(reads for t, reads in decode if t == 0)
