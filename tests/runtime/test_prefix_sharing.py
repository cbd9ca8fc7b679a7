"""Shared prompt blocks are exact: a request's outputs do not depend on which requests ran before
or beside it (prefix cache, the n samples of one request, max_num_seqs), Huginn's random
initial state included (fp64, CPU, against the dense reference)."""

from __future__ import annotations

import functools

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models.dense_reference import reference_generate
from rlt_runtime.models.huginn import request_initial_state
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.stable_hash import prompt_key, sample_key

PROMPT = list(range(5, 45))  # 40 tokens; with blocks of 16 the first 32 can be shared
SHARED = 32
SEED = 7


def huginn(**options) -> LLM:
    return LLM("huginn-tiny", dtype="float64", device="cpu", seed=0, block_size=16, **options)


@functools.lru_cache(maxsize=None)
def reference(sample_index: int, max_tokens: int) -> tuple[list[int], list[int], list[float]]:
    """Greedy tokens, exit depths and chosen log-probabilities of sample `sample_index` of a
    request seeded with SEED."""
    cfg = preset_config("huginn-tiny")
    w = dict(preset_weights(cfg, seed=0, dtype=torch.float64))
    init = request_initial_state(cfg, len(PROMPT), prompt_key(0), sample_key(SEED, sample_index))
    ref = reference_generate(cfg, w, PROMPT, max_tokens, initial_state=init)
    return ref.tokens, ref.exit_depths, [float(torch.log_softmax(lg, dim=-1)[t]) for lg, t in zip(ref.logits, ref.tokens)]


def count_prefill_tokens(llm: LLM) -> list[int]:
    """Record the prefill tokens of every step the engine schedules (appended to the returned list)."""
    counted: list[int] = []
    sched = llm.engine.scheduler
    schedule = sched.schedule

    def counting(*args, **kwargs):
        out = schedule(*args, **kwargs)
        counted.append(sum(len(c.token_ids) for c in out.prefills))
        return out

    sched.schedule = counting
    return counted


def test_huginn_prefix_cache_hit_equals_a_fresh_engine():
    """The same prompt with seed 2 gives the same tokens and log-probabilities alone and after a
    seed-1 request whose prompt blocks it takes from the cache."""
    def params(seed):
        return SamplingParams(max_tokens=5, temperature=1.0, seed=seed, ignore_eos=True, logprobs=2)

    alone = huginn(max_num_seqs=4).generate([PROMPT], params(2), use_tqdm=False)[0].outputs[0]
    llm = huginn(max_num_seqs=4)
    llm.generate([PROMPT], params(1), use_tqdm=False)
    after = llm.generate([PROMPT], params(2), use_tqdm=False)[0].outputs[0]
    assert llm.engine.stats()["prefix_cache_hits"] == SHARED // 16  # logical blocks taken from the cache
    assert after.token_ids == alone.token_ids
    assert [(lp.logprob, lp.top) for lp in after.logprobs] == [(lp.logprob, lp.top) for lp in alone.logprobs]


@pytest.mark.parametrize("prefix,max_num_seqs", [(True, 4), (False, 4), (True, 1)])
def test_huginn_n_samples_compute_the_prompt_once_and_match_the_reference(prefix, max_num_seqs):
    """n = 3 samples compute one prompt plus the last partial block per extra sample, and each
    sample equals the dense reference run alone with its own key (whatever max_num_seqs)."""
    llm = huginn(max_num_seqs=max_num_seqs, enable_prefix_caching=prefix)
    counted = count_prefill_tokens(llm)
    out = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=4, temperature=0, seed=SEED, ignore_eos=True, logprobs=0),
                       use_tqdm=False)[0]
    assert sum(counted) == len(PROMPT) + 2 * (len(PROMPT) - SHARED)
    for i, c in enumerate(out.outputs):
        tokens, depths, logprobs = reference(i, 4)
        assert (c.token_ids, c.exit_depths) == (tokens, depths), f"sample {i}"
        assert [lp.logprob for lp in c.logprobs] == pytest.approx(logprobs, abs=1e-5), f"sample {i}"
    llm.engine.check_invariants()
