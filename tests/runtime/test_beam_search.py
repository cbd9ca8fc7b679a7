"""Beam search (rlt_runtime/beam_search.py): the search's bookkeeping on hand-made rounds (ranking,
end-of-sequence beams, the length penalty, ties), and LLM.beam_search against a beam search run
here over the fp64 dense reference's log-probabilities; parameters are checked by name."""

from __future__ import annotations

import functools

import pytest
import torch

from rlt_runtime import LLM, ConfigError
from rlt_runtime.beam_search import BeamSearch, BeamSearchParams, round_params
from rlt_runtime.models.dense_reference import reference_generate
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.outputs import CompletionOutput, RequestOutput, TokenLogprob

EOS = 0


def _round(*tops: dict) -> list[RequestOutput]:
    """One round's outputs: a one-token greedy output per beam, its top log-probabilities given."""
    outs = []
    for top in tops:
        best = max(top, key=lambda t: (top[t], -t))
        sample = CompletionOutput(index=0, text="", token_ids=[best], exit_depths=[1], finish_reason="length",
                                  logprobs=[TokenLogprob(top[best], dict(top))])
        outs.append(RequestOutput("r", None, [], [sample], True))
    return outs


def test_rounds_keep_the_best_beams_and_complete_end_of_sequence_ones():
    search = BeamSearch([9, 9], BeamSearchParams(beam_width=2, max_tokens=3), [EOS], max_model_len=64)
    assert search.pending() == [[9, 9]]
    search.advance(_round({5: -0.5, 6: -1.0, EOS: -0.7, 7: -3.0}))
    assert search.pending() == [[9, 9, 5], [9, 9, 6]]  # EOS completed a beam instead of taking a place
    assert [b.tokens for b in search.completed] == [[9, 9, EOS]]
    search.advance(_round({8: -2.0, 7: -2.5, 1: -3.0, 2: -4.0}, {8: -0.2, 7: -0.3, 1: -5.0, 2: -6.0}))
    assert search.pending() == [[9, 9, 6, 8], [9, 9, 6, 7]]  # -1.2 and -1.3 beat -2.5 (both from beam 2)
    search.advance(_round({3: -0.1, 4: -0.2, 1: -9, 2: -9}, {3: -0.1, 4: -0.2, 1: -9, 2: -9}))
    assert search.done and search.pending() == []
    out = search.result(lambda ids: ",".join(map(str, ids)))
    # round 3: [6, 8, 4] and [6, 7, 3] both sum to -1.4: the earlier beam's wins the second place.
    # Scores: [6, 8, 3] -1.3 / 3, [6, 8, 4] -1.4 / 3, [EOS] -0.7 / 1 (the EOS not counted, at least 1)
    assert [s.tokens[2:] for s in out.sequences] == [[6, 8, 3], [6, 8, 4]]
    assert [s.finish_reason for s in out.sequences] == ["length", "length"] and out.sequences[0].text == "6,8,3"
    assert out.sequences[0].cum_logprob == pytest.approx(-1.3)
    assert [lp.logprob for lp in out.sequences[0].logprobs] == [-1.0, -0.2, -0.1]


def test_the_length_penalty_decides_between_short_and_long():
    def best(penalty):
        search = BeamSearch([9], BeamSearchParams(beam_width=1, max_tokens=2, length_penalty=penalty), [EOS], 64)
        search.advance(_round({5: -1.0, EOS: -1.5, 6: -4.0, 7: -5.0}))
        search.advance(_round({6: -1.0, 7: -2.0}))
        return search.result(str).sequences[0].tokens[1:]

    assert best(1.0) == [5, 6]  # -2.0 / 2 beats -1.5 / 1
    assert best(0.0) == [EOS]  # unnormalized: -1.5 beats -2.0


def test_ignore_eos_keeps_eos_beams_live_and_the_context_bounds_the_search():
    search = BeamSearch([9], BeamSearchParams(beam_width=1, max_tokens=5, ignore_eos=True), [EOS], max_model_len=3)
    search.advance(_round({EOS: -0.1, 5: -1.0, 6: -2.0, 7: -3.0}))
    assert search.pending() == [[9, EOS]] and not search.completed
    search.advance(_round({5: -0.1, 6: -1.0}))
    assert search.done  # three tokens fill a context of three


@pytest.mark.parametrize("kw,name", [(dict(beam_width=0, max_tokens=4), "beam_width"),
                                     (dict(beam_width=11, max_tokens=4), "beam_width"),
                                     (dict(beam_width=2, max_tokens=0), "max_tokens"),
                                     (dict(beam_width=2, max_tokens=4, length_penalty=float("nan")), "length_penalty")])
def test_parameters_name_the_field(kw, name):
    with pytest.raises(ConfigError, match=f"^{name}"):
        BeamSearchParams(**kw)


@functools.lru_cache(maxsize=None)
def _weights():
    cfg = preset_config("ouro-tiny")
    return cfg, dict(preset_weights(cfg, seed=0, dtype=torch.float64))


def _reference_beam_search(prompt: list[int], width: int, steps: int) -> list[list[int]]:
    """Textbook beam search over the fp64 reference's log-probabilities (each beam's top 2 x width
    tokens; no end-of-sequence token is among them for these prompts), best first."""
    cfg, w = _weights()
    beams = [([], 0.0)]
    for _ in range(steps):
        grown = []
        for out, cum in beams:
            lp = torch.log_softmax(reference_generate(cfg, w, prompt + out, 1).logits[0], dim=-1)
            top = torch.topk(lp, 2 * width)
            assert EOS not in top.indices.tolist()
            grown += [(out + [int(t)], cum + float(v)) for v, t in zip(top.values, top.indices)]
        beams = sorted(grown, key=lambda b: -b[1])[:width]
    return [out for out, _ in beams]


@pytest.mark.parametrize("prompt,width", [([5, 6, 7, 8], 3), ([40, 41, 42, 43, 44, 45], 2)])
def test_llm_beam_search_matches_a_reference_search(prompt, width):
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=8)
    got = llm.beam_search([prompt], BeamSearchParams(beam_width=width, max_tokens=4))[0]
    assert [s.tokens[len(prompt):] for s in got.sequences] == _reference_beam_search(prompt, width, 4)
    assert [s.text for s in got.sequences] == [llm.tokenizer.decode(s.tokens[len(prompt):]) for s in got.sequences]
    greedy = llm.generate([prompt], round_params(BeamSearchParams(beam_width=1, max_tokens=4)), use_tqdm=False)
    assert got.sequences[0].logprobs[0].logprob == greedy[0].outputs[0].logprobs[0].logprob
