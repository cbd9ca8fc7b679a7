"""Reported log-probabilities: the raw log_softmax of the logits at the token actually committed
(greedy or seeded sampling, plain decoding or speculative rounds) and the top N, against the fp64
dense reference teacher-forced on the engine's tokens; greedy speculation reports exactly the
log-probabilities plain decoding reports."""

from __future__ import annotations

import functools

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models.dense_reference import reference_generate
from rlt_runtime.models.huginn import request_initial_state
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.stable_hash import prompt_key, sample_key
from workload import run_workload

SEED = 5
TOP_N = 3
TOL = 1e-4  # fp32 engine vs the fp64 reference: errors < 1e-6 seen; another token's logprob is > 0.1 away
SPEC = {"num_speculative_tokens": 3, "draft_loops": 1, "draft_policy": "fixed"}
PROMPTS = [[5, 6, 7, 8], [40, 41]]


@functools.lru_cache(maxsize=None)
def _weights(preset: str):
    cfg = preset_config(preset)
    return cfg, dict(preset_weights(cfg, seed=0, dtype=torch.float64))


def reference_logprobs(preset: str, prompt: list[int], tokens: list[int], seed: int) -> list[torch.Tensor]:
    """fp64 log_softmax [vocab] of the logits each of `tokens` was chosen from, the reference fed
    the engine's own earlier tokens (full depth; Huginn's initial state from the request's key)."""
    cfg, w = _weights(preset)
    init = None
    if cfg.family == "huginn":
        init = request_initial_state(cfg, len(prompt), prompt_key(0), sample_key(seed, 0))
    return [torch.log_softmax(reference_generate(cfg, w, prompt + tokens[:i], 1, initial_state=init).logits[0], -1)
            for i in range(len(tokens))]


def assert_logprobs_match(out, ref: list[torch.Tensor]) -> None:
    """Each reported logprob is the reference's at the committed token; the top N are the
    reference's N largest, each reported with its own token's value."""
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == len(ref)
    for i, (token, lp, ref_lp) in enumerate(zip(out.token_ids, out.logprobs, ref)):
        assert abs(lp.logprob - float(ref_lp[token])) < TOL, (i, token, lp.logprob, float(ref_lp[token]))
        assert len(lp.top) == TOP_N
        got = sorted(lp.top.values(), reverse=True)
        want = ref_lp.sort(descending=True).values[:TOP_N].tolist()
        assert all(abs(a - b) < TOL for a, b in zip(got, want)), (i, got, want)
        assert all(abs(v - float(ref_lp[t])) < TOL for t, v in lp.top.items()), (i, lp.top)


@pytest.mark.parametrize("preset,temperature,speculative", [
    ("ouro-tiny", 0.0, False),
    ("ouro-tiny", 0.8, False),
    ("huginn-tiny", 0.0, False),
    ("huginn-tiny", 0.8, False),
    ("ouro-tiny", 0.0, True),
    ("ouro-tiny", 0.8, True),
])
def test_logprobs_match_the_reference(preset, temperature, speculative):
    llm = LLM(preset, dtype="float32", max_num_seqs=4, **({"speculative_config": SPEC} if speculative else {}))
    params = SamplingParams(max_tokens=6, temperature=temperature, seed=SEED, logprobs=TOP_N, ignore_eos=True)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    if speculative:
        assert llm.stats()["speculative"]["rounds"] > 0
    not_argmax = 0
    for prompt, o in zip(PROMPTS, outs):
        got = o.outputs[0]
        ref = reference_logprobs(preset, prompt, got.token_ids, SEED)
        assert_logprobs_match(got, ref)
        not_argmax += sum(int(r.argmax()) != t for r, t in zip(ref, got.token_ids))
    # Sampled requests must commit some non-argmax tokens, or their check could not tell them apart.
    assert (not_argmax > 0) == (temperature > 0)


def outputs(llm: LLM, work, params: SamplingParams) -> dict:
    """{index: (tokens, exit depths, [(logprob, top N)])} of a staggered-arrival workload."""
    return {i: (c.token_ids, c.exit_depths, [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
            for i, c in run_workload(llm, work, params).items()}


@pytest.mark.parametrize("preset,threshold", [("ouro-tiny", 1.0), ("ouro-tiny", 0.6), ("huginn-tiny", 1.0)])
def test_greedy_speculation_reports_plain_logprobs_bitwise(preset, threshold):
    """A greedy round's verify rows compute the very logits plain decoding computes (batch-invariant
    kernels, docs/design.md), so every logprob and top-N entry is bitwise the same."""
    work = [(PROMPTS[0], 0), (PROMPTS[1], 0), ([9, 10, 11], 2)]
    params = SamplingParams(max_tokens=10, temperature=0, exit_threshold=threshold, logprobs=TOP_N, ignore_eos=True,
                            seed=SEED)
    plain = outputs(LLM(preset, dtype="float32", max_num_seqs=4), work, params)
    spec = LLM(preset, dtype="float32", max_num_seqs=4, speculative_config=SPEC)
    assert outputs(spec, work, params) == plain
    assert spec.stats()["speculative"]["accepted"] > 0
