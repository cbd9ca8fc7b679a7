"""Logit processing (logit_bias, min_tokens, bad_words, repetition/presence/frequency penalties,
allowed_token_ids) and best_of, against an independent per-token reference of vLLM's semantics: the device state's apply
and commit steps, greedy engine decoding against the fp64 dense reference, batch invariance,
speculation, preemption (recompute and swap) and best_of ranking."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.errors import ConfigError, RequestError
from rlt_runtime.executor.logit_processing import LogitProcessing
from rlt_runtime.models.dense_reference import reference_generate, reference_logit_processing as reference_process
from rlt_runtime.models.presets import preset_config, preset_weights
from workload import run_workload

SPEC = {"num_speculative_tokens": 3, "draft_loops": 1, "draft_policy": "fixed"}
PROMPT = [5, 6, 7, 8, 5, 6, 246, 103, 101]  # holds tokens ouro-tiny likes to generate (246, 103, 101)


# ---- the device state ------------------------------------------------------------------------------

def _request(slot, params, prompt, output, stops=(), bad=()):
    return SimpleNamespace(slot=slot, params=params, prompt_token_ids=prompt, output_token_ids=output,
                           num_prompt_tokens=len(prompt), min_token_stops=list(stops), bad_word_ids=[list(w) for w in bad])


ROWS = [  # (params, prompt, output, min-token stops, bad words)
    (SamplingParams(repetition_penalty=1.7), [1, 2, 3], [3, 4, 4]),
    (SamplingParams(repetition_penalty=0.6, frequency_penalty=0.5, presence_penalty=-0.7), [9, 9, 1], [1, 1, 5, 7]),
    (SamplingParams(logit_bias={0: 5.0, 7: -30.0, 15: 0.25}, min_tokens=4, max_tokens=8), [2], [3, 3], [0, 7]),
    (SamplingParams(min_tokens=2, max_tokens=8, bad_words=[[4]]), [2, 2], [6, 6], [0], [[4], [6, 6, 11], [5, 12]]),
    (SamplingParams(), [1, 2], [3]),
]


def _state(rows, vocab=16, slots=12):
    lp = LogitProcessing(slots, vocab, "cpu")
    reqs = [_request(2 * i + 1, *row) for i, row in enumerate(rows)]
    lp.admit(reqs)
    return lp, reqs


def test_apply_matches_the_reference_per_row():
    torch.manual_seed(0)
    lp, reqs = _state(ROWS)
    logits = torch.randn(len(ROWS), 16) * 3
    idx = torch.tensor([r.slot for r in reqs])
    out_pos = torch.tensor([len(r.prompt_token_ids) + len(r.output_token_ids) for r in reqs])
    got = lp.apply(logits, idx, out_pos)
    for i, r in enumerate(reqs):
        want = reference_process(logits[i], r.prompt_token_ids, r.output_token_ids, r.params, r.min_token_stops,
                                 r.bad_word_ids)
        torch.testing.assert_close(got[i], want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[4], logits[4])  # neutral parameters leave a row bit for bit as it is


def test_apply_counts_uncommitted_drafts_and_commit_matches_admission():
    """A speculative row's earlier drafts count as output; committing tokens leaves the state
    admission would build from the longer output."""
    torch.manual_seed(1)
    lp, reqs = _state(ROWS)
    extra = torch.tensor([[4, 3, 0], [7, 1, 1], [3, 9, 9], [6, 6, 2], [8, 8, 8]])
    num_extra = torch.tensor([2, 3, 1, 2, 0])
    logits = torch.randn(len(ROWS), 16) * 3
    idx = torch.tensor([r.slot for r in reqs])
    out_pos = torch.tensor([r.num_prompt_tokens + len(r.output_token_ids) for r in reqs]) + num_extra
    got = lp.apply(logits, idx, out_pos, extra, num_extra)
    for i, r in enumerate(reqs):
        output = r.output_token_ids + extra[i, : num_extra[i]].tolist()
        want = reference_process(logits[i], r.prompt_token_ids, output, r.params, r.min_token_stops, r.bad_word_ids)
        torch.testing.assert_close(got[i], want, rtol=1e-6, atol=1e-6)
    live = torch.tensor([True, True, True, True, False])
    committed = torch.where(torch.arange(3)[None, :] < num_extra[:, None], extra, -1)
    lp.commit(idx, committed, live)
    longer = [(p, prompt, out + committed[i][committed[i] >= 0].tolist() if live[i] else out, *rest)
              for i, (p, prompt, out, *rest) in enumerate(ROWS)]
    fresh, _ = _state(longer)
    assert torch.equal(lp.counts, fresh.counts) and torch.equal(lp.tail[:-1], fresh.tail[:-1])


# ---- the engine against the dense reference --------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _weights():
    cfg = preset_config("ouro-tiny")
    return cfg, dict(preset_weights(cfg, seed=0, dtype=torch.float64))


def reference_tokens(prompt, params, n, stops=(), bad_words=()):
    """Greedy decoding with processed logits, the fp64 dense reference computing every step's logits."""
    cfg, w = _weights()
    out = []
    for _ in range(n):
        logits = reference_generate(cfg, w, prompt + out, 1).logits[0]
        out.append(int(reference_process(logits, prompt, out, params, list(stops), bad_words).argmax()))
        if out[-1] in stops and len(out) > params.min_tokens:
            break
    return out


@pytest.fixture(scope="module")
def llm():
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4)


def _greedy(llm, prompt, **kw):
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, **kw)
    return llm.generate([prompt], params, use_tqdm=False)[0].outputs[0], params


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=1.8),
    dict(repetition_penalty=0.5),  # < 1 favours seen tokens: the sign handling flips
    dict(frequency_penalty=1.5),
    dict(presence_penalty=1.5),
    dict(frequency_penalty=-1.0, presence_penalty=0.5, repetition_penalty=1.2),
    dict(logit_bias={246: -100.0, 17: 4.0}),
    dict(bad_words=[[101], [142, 142], [191, 142]]),
    dict(allowed_token_ids=[3, 17, 33, 200, 240]),
    dict(allowed_token_ids=[17, 33, 240], repetition_penalty=1.5, logit_bias={33: 2.0}),
], ids=["rep-high", "rep-low", "freq", "presence", "mixed", "bias", "bad-words", "allowed", "allowed-penalized"])
def test_greedy_decoding_matches_the_reference(llm, kw):
    plain, _ = _greedy(llm, PROMPT)
    got, params = _greedy(llm, PROMPT, **kw)
    assert got.token_ids != plain.token_ids  # the processing changes the output: the check has teeth
    assert got.token_ids == reference_tokens(PROMPT, params, 10, bad_words=kw.get("bad_words", []))
    assert set(got.token_ids) <= set(kw.get("allowed_token_ids", got.token_ids))


def test_min_tokens_holds_back_eos_and_stop_ids_exactly(llm):
    eos = llm.engine._eos[0]
    for m in (0, 1, 4):
        got, params = _greedy(llm, PROMPT, logit_bias={eos: 100.0}, min_tokens=m)
        assert len(got.token_ids) == 10  # ignore_eos: EOS does not end it, so EOS is not held back
        params = SamplingParams(max_tokens=10, temperature=0, logit_bias={eos: 100.0, 33: 90.0}, min_tokens=m,
                                stop_token_ids=[33])
        out = llm.generate([PROMPT], params, use_tqdm=False)[0].outputs[0]
        assert out.token_ids == reference_tokens(PROMPT, params, 10, stops=sorted({eos, 33}))
        assert len(out.token_ids) == m + 1 and out.token_ids[-1] == eos and out.finish_reason == "stop"


# ---- invariance, speculation, preemption ------------------------------------------------------------

PENALIZED = dict(repetition_penalty=1.3, frequency_penalty=0.6, presence_penalty=0.4, logit_bias={7: 3.0},
                 bad_words=[[101, 101]], min_tokens=3)


def _drive(llm, work):
    """work: [(prompt, params, arrival step)] -> {index: (tokens, logprobs)} of sample 0."""
    eng = llm.engine
    pending = sorted(((arr, i, p, sp) for i, (p, sp, arr) in enumerate(work)), key=lambda x: (x[0], x[1]))
    done, step = {}, 0
    while pending or eng.has_unfinished_requests():
        while pending and pending[0][0] <= step:
            _, i, p, sp = pending.pop(0)
            eng.add_request(f"r{i}", p, sp)
        for out in eng.step():
            if out.finished:
                c = out.outputs[0]
                done[int(out.request_id[1:])] = (c.token_ids, [(lp.logprob, sorted(lp.top.items())) for lp in c.logprobs])
        step += 1
    return done


@pytest.mark.parametrize("speculative", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_a_request_alone_or_in_a_crowd_gets_the_same_tokens(speculative, temperature):
    opts = dict(dtype="float32", max_num_seqs=4, **({"speculative_config": SPEC} if speculative else {}))
    llm = LLM("ouro-tiny", **opts)
    mine = SamplingParams(max_tokens=10, temperature=temperature, seed=3, logprobs=2, ignore_eos=True, **PENALIZED)
    plain = SamplingParams(max_tokens=10, temperature=temperature, seed=4, logprobs=2, ignore_eos=True)
    other = SamplingParams(max_tokens=8, temperature=0.7, seed=5, logprobs=1, repetition_penalty=0.8,
                           frequency_penalty=-0.5, ignore_eos=True)
    allowed = SamplingParams(max_tokens=10, temperature=temperature, seed=6, logprobs=2, ignore_eos=True,
                             allowed_token_ids=[17, 33, 101, 200, 240])
    alone = _drive(llm, [(PROMPT, mine, 0)])[0]
    plain_alone = _drive(llm, [([40, 41, 42], plain, 0)])[0]
    allowed_alone = _drive(llm, [([50, 51], allowed, 0)])[0]
    crowded = LLM("ouro-tiny", async_scheduling=True, **opts)  # async: the host learns tokens a step late
    _drive(crowded, [([50, 51], allowed, 0)])  # leaves its mask row, parameters and counts in the slot
    _drive(crowded, [(PROMPT, mine, 0)])  # ... that `plain` takes next
    crowd = _drive(crowded, [([40, 41, 42], plain, 0), ([9, 10, 11, 12], other, 0), (PROMPT, mine, 2),
                             ([7, 7, 7], other, 3), ([50, 51], allowed, 3)])
    assert crowd[2] == alone
    assert crowd[0] == plain_alone  # a request without processing shares processed steps unchanged
    assert crowd[4] == allowed_alone and set(allowed_alone[0]) <= set(allowed.allowed_token_ids)
    if speculative:
        assert crowded.stats()["speculative"]["accepted"] > 0


def test_greedy_speculation_commits_what_plain_decoding_commits():
    """Verify rows count the round's earlier drafts: a penalized greedy round commits the tokens
    (and raw logprobs) plain decoding commits."""
    params = SamplingParams(max_tokens=16, temperature=0, logprobs=2, ignore_eos=True, repetition_penalty=1.3,
                            frequency_penalty=0.5, bad_words=[[142, 142]])
    work = [(PROMPT, params, 0), ([40, 41, 42], params, 1)]
    plain = _drive(LLM("ouro-tiny", dtype="float32", max_num_seqs=4), work)
    deep_drafts = dict(SPEC, draft_loops=3)  # drafts close to the full depth: some get accepted on random weights
    spec_llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=deep_drafts)
    assert _drive(spec_llm, work) == plain
    assert spec_llm.stats()["speculative"]["accepted"] > 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_preemption_restores_the_counts(mode, temperature):
    prompts = [list(range(5, 30)), [40, 41, 42], list(range(60, 95)), [7, 8, 9, 10, 11], list(range(100, 120))]
    params = SamplingParams(max_tokens=14, temperature=temperature, seed=5, logprobs=2, ignore_eos=True,
                            repetition_penalty=1.5, frequency_penalty=1.0, presence_penalty=0.5, bad_words=[[101, 101]])
    options = dict(dtype="float32", max_num_seqs=4, block_size=16, enable_prefix_caching=False)

    def outputs(llm):
        return {i: (c.token_ids, [lp.logprob for lp in c.logprobs])
                for i, c in run_workload(llm, [(p, i % 3) for i, p in enumerate(prompts)], params).items()}

    roomy = outputs(LLM("ouro-tiny", **options))
    tight = LLM("ouro-tiny", num_blocks=16, preemption_mode=mode, **options)
    assert outputs(tight) == roomy
    assert tight.engine.stats()["preemptions"] > 0


# ---- best_of -------------------------------------------------------------------------------------------

def test_best_of_returns_the_highest_cumulative_logprobs(llm):
    every = llm.generate([PROMPT], SamplingParams(n=5, max_tokens=6, temperature=1.0, seed=9, logprobs=0),
                         use_tqdm=False)[0].outputs
    sums = [sum(lp.logprob for lp in c.logprobs) for c in every]
    assert len(set(sums)) == 5
    best = llm.generate([PROMPT], SamplingParams(n=2, best_of=5, max_tokens=6, temperature=1.0, seed=9),
                        use_tqdm=False)[0].outputs
    ranked = sorted(range(5), key=lambda i: -sums[i])[:2]
    assert [c.token_ids for c in best] == [every[i].token_ids for i in ranked]
    assert [c.index for c in best] == [0, 1] and best[0].logprobs is None
    assert [c.cumulative_logprob for c in best] == [sums[i] for i in ranked]


# ---- validation ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,field", [
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=float("nan")), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=True), "frequency_penalty"),
    (dict(logit_bias={3: 100.5}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias=[1, 2]), "logit_bias"),
    (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=17, max_tokens=16), "min_tokens"),
    (dict(bad_words="word"), "bad_words"),
    (dict(bad_words=[[]]), "bad_words"),
    (dict(n=3, best_of=2), "best_of"),
    (dict(best_of=65), "best_of"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[1, -2]), "allowed_token_ids"),
    (dict(allowed_token_ids=(1, True)), "allowed_token_ids"),
])
def test_sampling_params_errors_name_the_field(kw, field):
    with pytest.raises(ConfigError, match=f"^{field}"):
        SamplingParams(**kw)


@pytest.mark.parametrize("kw,field", [
    (dict(logit_bias={10**6: 1.0}), "logit_bias"),
    (dict(bad_words=[[1, 10**6]]), "bad_words"),
    (dict(bad_words=[list(range(1, 10))]), "bad_words"),
    (dict(bad_words=[[i] for i in range(40)]), "bad_words"),
    (dict(allowed_token_ids=[5, 10**6]), "allowed_token_ids"),
])
def test_engine_errors_name_the_field(llm, kw, field):
    with pytest.raises(RequestError, match=f"^{field}"):
        llm.engine.add_request("bad", PROMPT, SamplingParams(**kw))


# ---- the penalty state: optional, and counted by the KV planner ----------------------------------

def test_without_penalties_the_state_is_not_allocated_and_penalties_are_refused(llm):
    """enable_penalties=False drops the two [slots, vocab] tensors; bias, min_tokens and bad words
    still give the engine-with-penalties' tokens, speculative rounds included; a penalty is a
    RequestError naming its field."""
    lean = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, enable_penalties=False, speculative_config=SPEC)
    full, slim = llm.engine.executor.worker.runner.logit_proc, lean.engine.executor.worker.runner.logit_proc
    assert slim.counts is None and slim.prompt_mask is None
    assert full.nbytes - slim.nbytes == 4 * preset_config("ouro-tiny").vocab_size * 5
    kept = dict(logit_bias={7: 3.0, 246: -5.0}, bad_words=[[101, 101]], min_tokens=3)
    assert _greedy(lean, PROMPT, **kept)[0].token_ids == _greedy(llm, PROMPT, **kept)[0].token_ids
    for name, value in (("repetition_penalty", 1.2), ("presence_penalty", 0.5), ("frequency_penalty", -0.5)):
        with pytest.raises(RequestError, match=f"^{name} needs the engine option enable_penalties=True"):
            lean.engine.add_request("bad", PROMPT, SamplingParams(**{name: value}))
    assert not lean.engine.has_unfinished_requests()


def test_kv_planner_sets_the_penalty_state_aside(monkeypatch):
    """On CUDA the pool is sized from gpu_memory_utilization minus weights, the per-slot state
    (penalty state and guided-decoding bitmasks), the step peak and the reserve (torch.cuda's device
    queries stubbed: the arithmetic alone)."""
    from rlt_runtime.cache import memory
    from rlt_runtime.executor import worker

    gib = 2**30
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=10 * gib))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (9 * gib, 10 * gib))
    cfg = SimpleNamespace(num_blocks=None, kv_cache_memory_bytes=None, gpu_memory_utilization=0.5)
    plan = lambda state: memory.plan_kv_cache(  # noqa: E731
        cfg, device=torch.device("cuda"), per_block=2**20, useful_blocks=10**6, weights_bytes=gib,
        profile_peak=lambda: gib // 2, state_bytes=state)
    base, with_state = plan(0), plan(194 * 2**20)
    assert base.num_blocks == (5 * gib - gib - gib // 2 - memory.RESERVE_BYTES) // 2**20
    assert base.num_blocks - with_state.num_blocks == 194 and with_state.state_bytes == 194 * 2**20
    seen = []
    real = worker.plan_kv_cache
    monkeypatch.setattr(worker, "plan_kv_cache", lambda *a, **kw: seen.append(kw["state_bytes"]) or real(*a, **kw))
    for enabled in (True, False):
        eng = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, enable_penalties=enabled).engine
        runner = eng.executor.worker.runner
        masks = runner.token_mask.mask
        assert masks.shape[1] == -(-preset_config("ouro-tiny").vocab_size // 32) and masks.dtype == torch.int32
        assert seen[-1] == runner.logit_proc.nbytes + masks.numel() * 4
    assert seen[0] - seen[1] == 4 * preset_config("ouro-tiny").vocab_size * 5
