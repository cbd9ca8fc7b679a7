"""Preemption (recompute or swap) changes no output: tokens, exit depths, log-probabilities and
their top-N, for greedy and seeded sampled requests, Ouro with early exit and Huginn."""

from __future__ import annotations

import pytest

from rlt_runtime import LLM, SamplingParams
from workload import run_workload

PROMPTS = [list(range(5, 30)), [40, 41, 42], list(range(60, 95)), [7, 8, 9, 10, 11], list(range(100, 120))]


def outputs(llm, params):
    done = run_workload(llm, [(p, i % 3) for i, p in enumerate(PROMPTS)], params)
    return {i: (c.token_ids, c.exit_depths, [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
            for i, c in done.items()}


@pytest.mark.parametrize("preset,mode", [("ouro-tiny", "recompute"), ("ouro-tiny", "swap"), ("huginn-tiny", "recompute")])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_preempted_requests_keep_every_output(preset, mode, temperature):
    params = SamplingParams(max_tokens=12, temperature=temperature, top_k=40, seed=5, logprobs=3, ignore_eos=True,
                            exit_threshold=0.6 if preset == "ouro-tiny" else 1.0)
    options = dict(dtype="float32", max_num_seqs=4, block_size=16, enable_prefix_caching=False)
    if preset == "huginn-tiny":
        options["exit_mode"] = "latent-diff"
        options["exit_criterion_threshold"] = 1.2
    roomy = outputs(LLM(preset, **options), params)
    tight = LLM(preset, num_blocks=16 if preset == "ouro-tiny" else 20, preemption_mode=mode, **options)
    assert outputs(tight, params) == roomy
    assert tight.engine.stats()["preemptions"] > 0


def test_prefill_launches_the_decode_arithmetic_only_for_recomputed_outputs(monkeypatch):
    """A prefill step runs the decode kernel beside the tile kernel only when one of its chunks
    reaches past its prompt (outputs recomputed after a preemption, which must keep decode's
    bits); steps of prompt tokens alone skip that launch (on the GPU its programs all exit, ~57 µs
    per attention call at 4,096 prompt tokens)."""
    from rlt_runtime.executor.model_runner import ModelRunner

    seen = []
    program = ModelRunner.prefill_program

    def spied(self, size, want_lp, num_top, processed=False, generated=True, **kw):
        st = self.pre_in
        n_seq = int(st["counts"][1])
        past_prompt = bool((st["seq_lens"][:n_seq] > st["decode_from"][:n_seq]).any())
        seen.append((generated, past_prompt))
        return program(self, size, want_lp, num_top, processed, generated, **kw)

    monkeypatch.setattr(ModelRunner, "prefill_program", spied)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    tight = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, block_size=16, enable_prefix_caching=False,
                num_blocks=16, preemption_mode="recompute")
    run_workload(tight, [(p, i % 3) for i, p in enumerate(PROMPTS)], params)
    assert tight.engine.stats()["preemptions"] > 0
    assert all(generated == past for generated, past in seen)
    assert {past for _, past in seen} == {True, False}
