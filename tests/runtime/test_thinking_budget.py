"""thinking_token_budget (engine/thinking_budget.py): the matcher's counting and forcing against
hand-worked token sequences, its masks and rollback; the engine's greedy tokens against the fp64
dense reference forced by an independent rule; speculation, async crowds and a grammar after the
reasoning."""

from __future__ import annotations

import functools
import json
import math

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.errors import ConfigError
from rlt_runtime.engine.thinking_budget import ThinkingBudget
from rlt_runtime.executor.token_mask import new_bitmask, unpack_bitmask
from rlt_runtime.models.dense_reference import reference_generate
from rlt_runtime.models.presets import preset_config, preset_weights
from test_logit_processing import _drive

START, END = [1, 2], [3, 31, 63]  # 31 and 63: the sign bits of their int32 words
VOCAB = 70


def _budget(budget, prompt, inner=None):
    return ThinkingBudget(budget, START, END, prompt, inner)


def _allowed(matcher) -> list[int]:
    masks = new_bitmask(1, VOCAB)
    matcher.fill_next_token_bitmask(masks, 0)
    return unpack_bitmask(masks, VOCAB)[0].nonzero().flatten().tolist()


def _take(matcher, tokens):
    for t in tokens:
        assert matcher.accept_token(t), t


def test_the_reasoning_opened_in_the_output_is_counted_then_closed():
    m = _budget(2, [9, 9])
    _take(m, [5, 6, 7])  # no reasoning yet: no limit
    assert m.forced() is None and len(_allowed(m)) == VOCAB
    _take(m, START + [5, 6])
    assert m.forced() == 3 and _allowed(m) == [3]
    assert not m.accept_token(5)  # the budget refuses anything else
    _take(m, [3])
    assert m.forced() == 31 and _allowed(m) == [31]
    _take(m, [31])
    assert _allowed(m) == [63]
    _take(m, [63, 5, 5, 5])  # the marker closed the reasoning
    assert m.forced() is None
    _take(m, START + [7, 7])  # a new reasoning block counts from zero
    assert m.forced() == 3


@pytest.mark.parametrize("prompt,budget,free", [
    ([9] + START, 3, 3),  # the prompt opens the reasoning: three tokens may follow
    ([9] + START + [7, 7], 3, 1),  # ... two of them already in the prompt
    ([9] + START + [7, 7, 7, 7], 3, 0),  # a prompt past the budget: forced at once
    ([9] + START, 0, 0),
    (START + [7] + END + [7], 1, None),  # the prompt's reasoning is closed
])
def test_the_prompt_s_open_reasoning_counts(prompt, budget, free):
    m = _budget(budget, prompt)
    for _ in range(free if free is not None else 5):
        assert m.forced() is None
        _take(m, [8])
    assert m.forced() == (None if free is None else 3)


def test_a_marker_the_model_began_is_continued():
    m = _budget(1, START)
    _take(m, [3])  # the reasoning's first token is the end marker's first
    assert m.forced() == 31  # continued, not restarted
    _take(m, [31, 63])
    assert m.forced() is None


def test_rollback_restores_the_state():
    m = _budget(2, START)
    _take(m, [5, 6, 3])
    m.rollback(2)
    assert m.forced() is None
    _take(m, [8])
    assert m.forced() == 3
    m.rollback(2)
    assert m.state.count == 0 and m.state.thinking and m.forced() is None


class _Inner:
    """A grammar stand-in allowing `allowed` tokens at every position and recording what it accepts."""

    def __init__(self, allowed):
        self.allowed, self.taken = allowed, []

    def fill_next_token_bitmask(self, bitmask, row):
        bitmask[row] = 0
        for t in self.allowed:
            bitmask[row, t // 32] |= torch.tensor(t % 32 == 31 and -(1 << 31) or 1 << (t % 32), dtype=torch.int32)

    def accept_token(self, token):
        if token in self.allowed:
            self.taken.append(token)
        return token in self.allowed

    def rollback(self, n):
        del self.taken[len(self.taken) - n:]

    def is_terminated(self):
        return False


def test_a_grammar_is_narrowed_to_the_forced_token_only_where_it_allows_it():
    inner = _Inner([3, 8, 9])
    m = _budget(0, START, inner)
    assert _allowed(m) == [3]
    assert not m.accept_token(10)  # the grammar refuses
    _take(m, [3])
    assert _allowed(m) == [3, 8, 9]  # the grammar does not allow 31: its row stands
    assert inner.taken == [3]
    m.rollback(1)
    assert inner.taken == [] and _allowed(m) == [3]  # both roll back
    assert not m.is_terminated()


def test_sampling_params_checks_the_budget():
    assert SamplingParams(thinking_token_budget=-1).thinking_token_budget is None
    for bad in (-2, 1.0, True, "3"):
        with pytest.raises(ConfigError, match="^thinking_token_budget"):
            SamplingParams(thinking_token_budget=bad)


# ---- the engine ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _weights():
    cfg = preset_config("ouro-tiny")
    return cfg, dict(preset_weights(cfg, seed=0, dtype=torch.float64))


@pytest.fixture(scope="module")
def llm():
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4)


def _ids(llm, text):
    return llm.engine.tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("budget", [0, 2, 5])
def test_greedy_tokens_are_the_reference_forced_after_the_budget(llm, budget):
    """The prompt opens the reasoning; the fp64 reference's argmax is forced to the end marker's
    tokens at outputs budget .. budget + len(marker) - 1 (the free outputs hold no marker)."""
    prompt, end = _ids(llm, "Why?<think>"), _ids(llm, "</think>")

    def forced(logits, out):
        k = len(out) - budget
        if not 0 <= k < len(end):
            return logits
        row = torch.full_like(logits, -math.inf)
        row[end[k]] = 0.0
        return row

    n = budget + len(end) + 4
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, thinking_token_budget=budget)
    got = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    cfg, w = _weights()
    want = reference_generate(cfg, w, prompt, n, process_logits=forced).tokens
    assert got == want and got[budget:budget + len(end)] == end
    plain = llm.generate([prompt], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True), use_tqdm=False)
    assert plain[0].outputs[0].token_ids != got  # the forcing changed the output: the check has teeth


SPEC = {"num_speculative_tokens": 3, "draft_loops": 3, "draft_policy": "fixed"}


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_budgeted_requests_alone_in_a_crowd_and_under_speculation(llm, temperature):
    prompt = _ids(llm, "Why?<think>")
    budgeted = SamplingParams(max_tokens=14, temperature=temperature, seed=4, logprobs=1, ignore_eos=True,
                              thinking_token_budget=3)
    plain = SamplingParams(max_tokens=10, temperature=temperature, seed=5, logprobs=1, ignore_eos=True)
    alone = _drive(llm, [(prompt, budgeted, 0)])[0]
    crowd_llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, async_scheduling=True)
    crowd = _drive(crowd_llm, [([40, 41, 42], plain, 0), (prompt, budgeted, 1), ([9, 10], plain, 2)])
    assert crowd[1] == alone and crowd[1][0][3:11] == _ids(llm, "</think>")
    assert crowd[0] == _drive(llm, [([40, 41, 42], plain, 0)])[0]
    spec = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=SPEC)
    spec_alone = _drive(spec, [(prompt, budgeted, 0)])[0]
    assert spec_alone[0][3:11] == _ids(llm, "</think>")
    if temperature == 0.0:  # greedy speculation commits what plain decoding commits
        assert spec_alone == alone
    assert _drive(spec, [([40, 41, 42], plain, 0), (prompt, budgeted, 0)])[1] == spec_alone
    assert spec.stats()["speculative"]["drafted"] > 0


def test_a_grammar_after_the_reasoning_follows_the_forced_end(llm):
    pytest.importorskip("xgrammar")
    prompt = _ids(llm, "Why?<think>")
    guided = {"json": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
              "after": "</think>"}
    params = SamplingParams(max_tokens=40, temperature=0, thinking_token_budget=2, guided=guided)
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    reasoning, answer = out.text.split("</think>", 1)
    assert len(_ids(llm, reasoning)) <= 2 and out.token_ids[2:10] == _ids(llm, "</think>")
    assert isinstance(json.loads(answer)["a"], int)
