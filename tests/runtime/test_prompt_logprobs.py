"""Prompt log-probabilities (SamplingParams.prompt_logprobs): None for the first prompt token, then
each token's raw log-probability given the tokens before it and the top N at its position, against
the fp64 dense reference's log_softmax at the prompt positions; the same bits with chunked
prefill, batch neighbours, a prefix-cache hit, preemption (recompute and swap) and async
scheduling, and for every sample count."""

from __future__ import annotations

import functools

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.errors import ConfigError
from rlt_runtime.models.dense_reference import reference_generate
from rlt_runtime.models.huginn import request_initial_state
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.stable_hash import prompt_key, sample_key

TOP_N = 3
TOL = 1e-4  # fp32 engine vs the fp64 reference (see test_logprobs.py)
PROMPT = [5, 9, 33, 7, 12, 40, 41, 3, 77, 19, 23, 61, 8, 50, 2, 90, 14, 31, 44]  # spans two 16-token blocks
OPTIONS = dict(dtype="float32", max_num_seqs=4, block_size=16)


@functools.lru_cache(maxsize=None)
def _weights(preset: str):
    cfg = preset_config(preset)
    return cfg, dict(preset_weights(cfg, seed=0, dtype=torch.float64))


def reference_prompt_logprobs(preset: str, prompt: list[int]) -> list[torch.Tensor]:
    """fp64 log_softmax [vocab] at prompt positions 0 .. len - 2 (position q predicts token q + 1)."""
    cfg, w = _weights(preset)
    init = None
    if cfg.family == "huginn":  # prompt positions take the engine's prompt key (seed 0)
        init = request_initial_state(cfg, len(prompt), prompt_key(0), sample_key(0, 0))
    logits = reference_generate(cfg, w, prompt, 1, initial_state=init).prompt_logits
    return [torch.log_softmax(x, -1) for x in logits[:-1]]


def flat(prompt_logprobs) -> list:
    """Comparable form of RequestOutput.prompt_logprobs (exact values, top sorted by id)."""
    return [None if e is None else (e.logprob, sorted(e.top.items())) for e in prompt_logprobs]


@pytest.mark.parametrize("preset", ["ouro-tiny", "huginn-tiny"])
def test_prompt_logprobs_match_the_reference(preset):
    out = LLM(preset, **OPTIONS).generate([PROMPT], SamplingParams(max_tokens=1, temperature=0,
                                                                    prompt_logprobs=TOP_N), use_tqdm=False)[0]
    ref = reference_prompt_logprobs(preset, PROMPT)
    plp = out.prompt_logprobs
    assert len(plp) == len(PROMPT) and plp[0] is None
    for i in range(1, len(PROMPT)):
        want = ref[i - 1]
        assert abs(plp[i].logprob - float(want[PROMPT[i]])) < TOL, (i, plp[i].logprob, float(want[PROMPT[i]]))
        assert len(plp[i].top) == TOP_N
        got = sorted(plp[i].top.values(), reverse=True)
        assert all(abs(a - b) < TOL for a, b in zip(got, want.sort(descending=True).values[:TOP_N].tolist())), i
        assert all(abs(v - float(want[t])) < TOL for t, v in plp[i].top.items()), i
    # Generated-token log-probabilities are not reported unless asked for.
    assert out.outputs[0].logprobs is None


def test_prompt_logprobs_zero_and_off():
    llm = LLM("ouro-tiny", **OPTIONS)
    zero, off = llm.generate([PROMPT, PROMPT], [SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0),
                                                SamplingParams(max_tokens=1, temperature=0)], use_tqdm=False)
    assert zero.prompt_logprobs[0] is None and all(e.top == {} for e in zero.prompt_logprobs[1:])
    assert len(zero.prompt_logprobs) == len(PROMPT)
    assert off.prompt_logprobs is None


def _run(llm, work: list[tuple[list[int], SamplingParams]]) -> list:
    """Run (prompt, params) requests together, each added one step after the previous one;
    returns their final RequestOutputs in order."""
    eng = llm.engine
    done, step = {}, 0
    while len(done) < len(work):
        if step < len(work):
            eng.add_request(f"r{step}", work[step][0], work[step][1])
        for out in eng.step():
            if out.finished:
                done[int(out.request_id[1:])] = out
        eng.check_invariants()
        step += 1
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    return [done[i] for i in range(len(work))]


ASK = SamplingParams(max_tokens=6, temperature=0, seed=3, ignore_eos=True, prompt_logprobs=TOP_N)  # seeded: Huginn's
# generated positions take the request's key, which otherwise follows its arrival
PLAIN = SamplingParams(max_tokens=6, temperature=0, seed=3, ignore_eos=True)
OTHERS = [list(range(60, 95)), list(range(100, 140)), [7, 8, 9, 10, 11]]


@pytest.mark.parametrize("preset", ["ouro-tiny", "huginn-tiny"])
def test_prompt_logprobs_do_not_depend_on_scheduling(preset):
    alone = LLM(preset, **OPTIONS).generate([PROMPT], ASK, use_tqdm=False)[0]
    want = flat(alone.prompt_logprobs)
    assert len(want) == len(PROMPT)
    cases = {
        "chunked prefill": (dict(prefill_chunk_size=4), [(PROMPT, ASK)]),
        "batched": (dict(prefill_chunk_size=8), [(OTHERS[0], PLAIN), (PROMPT, ASK), (OTHERS[1], PLAIN)]),
        # The first request publishes PROMPT's first block; the second must not skip those positions.
        "prefix-cache hit": (dict(enable_prefix_caching=True), [(PROMPT, PLAIN), (PROMPT, ASK)]),
        "async": (dict(async_scheduling=True, prefill_chunk_size=5), [(OTHERS[2], PLAIN), (PROMPT, ASK)]),
    }
    for name, (options, work) in cases.items():
        llm = LLM(preset, **dict(OPTIONS, **options))
        outs = _run(llm, work)
        got = next(o for o, (_, p) in zip(outs, work) if p is ASK)
        assert flat(got.prompt_logprobs) == want, name
        assert got.outputs[0].token_ids == alone.outputs[0].token_ids, name
        if name == "prefix-cache hit":
            assert llm.engine.stats()["prefix_cache_hits"] == 0  # the request asking for them took no hit
            assert outs[0].prompt_logprobs is None


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_prompt_logprobs_survive_preemption(mode):
    options = dict(OPTIONS, enable_prefix_caching=False, prefill_chunk_size=4)
    work = [(OTHERS[0], PLAIN), (PROMPT, ASK), (OTHERS[1], PLAIN), (list(range(150, 175)), ASK)]
    roomy = _run(LLM("ouro-tiny", **options), work)
    tight = LLM("ouro-tiny", num_blocks=16, preemption_mode=mode, **options)
    outs = _run(tight, work)
    assert tight.engine.stats()["preemptions"] > 0
    for a, b, (prompt, params) in zip(roomy, outs, work):
        if params is ASK:
            assert len(b.prompt_logprobs) == len(prompt)
            assert flat(b.prompt_logprobs) == flat(a.prompt_logprobs)
        assert b.outputs[0].token_ids == a.outputs[0].token_ids


def test_prompt_logprobs_once_per_prompt_with_n_samples():
    llm = LLM("ouro-tiny", **dict(OPTIONS, enable_prefix_caching=True))
    one = llm.generate([PROMPT], ASK, use_tqdm=False)[0]
    many = llm.generate([PROMPT], SamplingParams(n=3, max_tokens=4, temperature=1.0, seed=1, prompt_logprobs=TOP_N),
                        use_tqdm=False)[0]
    assert len(many.outputs) == 3
    assert flat(many.prompt_logprobs) == flat(one.prompt_logprobs)


def test_prompt_logprobs_validation():
    with pytest.raises(ConfigError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ConfigError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=True)
