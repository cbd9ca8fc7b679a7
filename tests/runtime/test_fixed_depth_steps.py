"""Decode steps whose rows all run every loop (exit_threshold 1 and no loop cap below the depth,
or Huginn's fixed mode) skip the exit rule, and the row compaction before the last loop
(`ModelRunner.run_loops(fixed=True)`): the same tokens, exit depths and log-probabilities as the
full path, in batches that mix such rows with rows that exit early."""

from __future__ import annotations

import pytest

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models.exit_rules import ExitRule

PROMPTS = ["the loop", "a looped model", "x", "depth and width"]


def _params(threshold: float, max_loops=None, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, exit_threshold=threshold, max_loops=max_loops,
                          logprobs=2, **kw)


def _run(llm: LLM, params: list[SamplingParams], fixed_steps: bool) -> tuple[list, list]:
    runner = llm.engine.executor.worker.runner
    runner.fixed_steps = fixed_steps
    calls = []
    decide = runner.model.exit_decision

    def counting(rule, t, *args):
        calls.append(t)
        return decide(rule, t, *args)

    runner.model.exit_decision = counting
    try:
        outs = llm.generate(PROMPTS[: len(params)], params, use_tqdm=False)
    finally:
        runner.model.exit_decision = decide
    got = [(o.outputs[0].token_ids, o.outputs[0].exit_depths, [lp.logprob for lp in o.outputs[0].logprobs]) for o in outs]
    return got, calls


@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_fixed_depth_steps_match_the_full_path(model):
    # One engine per path: Huginn's initial states are drawn per request, from the engine's seed
    # and the order requests arrive in. Eager, so the exit rule's calls are counted on any device
    # (a CUDA graph replays its program without calling back into Python).
    fast_llm, full_llm = (LLM(model, dtype="float32", max_num_seqs=4, seed=3, execution_mode="eager") for _ in range(2))
    depth = fast_llm.engine.depth
    cases = [([_params(1.0)] * 3, False), ([_params(1.0), _params(1.0, max_loops=2)], True)]
    if model == "ouro-tiny":  # Huginn's exit_mode "fixed": only a loop cap ends a row early
        cases.append(([_params(0.6), _params(1.0)], True))
    for params, some_leave_early in cases:
        fast, calls_fast = _run(fast_llm, params, True)
        full, calls_full = _run(full_llm, params, False)
        assert fast == full
        assert some_leave_early == any(d < depth for _, depths, _ in full for d in depths[1:])  # the test can tell
        if not some_leave_early:  # the rule never ran (its answer at the last loop is known), the full path's did
            assert not calls_fast and len(calls_full) >= depth * 9


def test_which_rows_may_exit_early():
    ouro, huginn_fixed, kl = ExitRule("ouro"), ExitRule("fixed"), ExitRule("kl", 0.1)
    assert not ouro.may_exit_early(1.0, 4, 4)
    assert ouro.may_exit_early(0.9, 4, 4) and ouro.may_exit_early(1.0, 3, 4)
    assert not huginn_fixed.may_exit_early(0.5, 8, 8) and huginn_fixed.may_exit_early(1.0, 7, 8)
    assert kl.may_exit_early(1.0, 8, 8) and ExitRule("trace").may_exit_early(1.0, 4, 4)


@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_fixed_depth_dense_kernels_take_no_live_count(model):
    """A fixed-depth decode pass hands its linear layers and norms no live-row count (the rows past
    it are a bucket's padding that nothing reads, and a count read before every launch's loads cost
    the H200's batch-1 step 0.16 ms), while its attention keeps the count (padding rows write no
    K/V); a pass whose rows may exit early hands the count to every kernel."""
    llm = LLM(model, dtype="float32", max_num_seqs=4, seed=3, execution_mode="eager")
    runner = llm.engine.executor.worker.runner
    ops, program = runner.ops, runner.decode_program
    seen, decoding = [], []
    dense = ("linear", "linear_residual_norm", "rms_norm", "residual_norm")

    def recording(name, fn):
        def call(*args, **kwargs):
            if decoding:
                count = kwargs.get("active_seqs" if name == "rope_paged_attention" else "active_rows")
                seen.append((decoding[-1], name, count is None))
            return fn(*args, **kwargs)
        return call

    def decode_program(b, want_lp, num_top, processed=False, fixed=False, late=False):
        decoding.append(fixed)
        try:
            return program(b, want_lp, num_top, processed, fixed, late)
        finally:
            decoding.pop()

    originals = {name: getattr(ops, name) for name in dense + ("rope_paged_attention",)}
    for name, fn in originals.items():
        setattr(ops, name, recording(name, fn))
    runner.decode_program = decode_program
    try:
        for threshold in (1.0, 0.6) if model == "ouro-tiny" else (1.0,):
            llm.generate(PROMPTS[:2], [_params(threshold)] * 2, use_tqdm=False)
    finally:
        for name, fn in originals.items():
            setattr(ops, name, fn)
        del runner.decode_program
    fixed_passes = {(name, without) for fixed, name, without in seen if fixed}
    assert {name for name, _ in fixed_passes} >= {"linear", "rope_paged_attention"}
    assert fixed_passes == {(name, name in dense) for name, _ in fixed_passes}
    if model == "ouro-tiny":
        others = {(name, without) for fixed, name, without in seen if not fixed}
        assert others and not any(without for _, without in others)
