"""repetition_detection (SamplingParams, vLLM's RepetitionDetectionParams): the pattern rule on
hand-made outputs, and engines (plain, speculative, async) stopping at the first token that
completes a repetition, with the tokens of the unrestricted run up to there."""

from __future__ import annotations

import pytest

from rlt_runtime import LLM, ConfigError, SamplingParams
from rlt_runtime.sampling_params import RepetitionDetectionParams

PROMPT = [5, 6, 7, 8, 5, 6, 246, 103, 101]  # greedy ouro-tiny: 142, then 101 over and over


@pytest.mark.parametrize("tokens,rule,hit", [
    ([1, 2, 3, 3, 3], dict(max_pattern_size=1, min_count=3), True),
    ([1, 2, 3, 3], dict(max_pattern_size=1, min_count=3), False),
    ([9, 1, 2, 1, 2, 1, 2], dict(max_pattern_size=2, min_count=3), True),
    ([9, 1, 2, 1, 2, 1, 2], dict(max_pattern_size=3, min_pattern_size=3, min_count=2), False),  # size 2 not allowed
    ([1, 2, 3, 1, 2, 3], dict(max_pattern_size=3, min_pattern_size=3, min_count=2), True),
    ([1, 2, 1, 2, 1, 2, 5], dict(max_pattern_size=2, min_count=3), False),  # must end the output
])
def test_the_rule(tokens, rule, hit):
    assert RepetitionDetectionParams(**rule).repeats(tokens) is hit


@pytest.mark.parametrize("rule,field", [(dict(max_pattern_size=2, min_count=1), "min_count"),
                                        (dict(max_pattern_size=2, min_pattern_size=3, min_count=2), "min_pattern_size"),
                                        (dict(max_pattern_size=-1, min_count=2), "max_pattern_size"),
                                        (dict(max_pattern_size=2, count=3), None)])
def test_bad_rules_name_the_field(rule, field):
    with pytest.raises(ConfigError, match=f"^repetition_detection{'.' + field if field else ''}"):
        SamplingParams(repetition_detection=rule)
    assert SamplingParams(repetition_detection={"max_pattern_size": 0}).repetition_detection is None  # off


@pytest.mark.parametrize("options", [{}, {"async_scheduling": True},
                                     {"speculative_config": {"num_speculative_tokens": 3, "draft_loops": 3}}])
def test_engines_stop_at_the_first_repetition(options):
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, **options)
    kw = dict(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = llm.generate([PROMPT], SamplingParams(**kw), use_tqdm=False)[0].outputs[0]
    out = llm.generate([PROMPT], SamplingParams(repetition_detection={"max_pattern_size": 2, "min_count": 4}, **kw),
                       use_tqdm=False)[0].outputs[0]
    first = next(n for n in range(1, len(plain.token_ids) + 1)
                 if RepetitionDetectionParams(2, 0, 4).repeats(plain.token_ids[:n]))
    assert out.token_ids == plain.token_ids[:first] and len(out.exit_depths) == first
    assert (out.finish_reason, out.stop_reason) == ("stop", "repetition_detected")
    assert out.text == llm.tokenizer.decode(out.token_ids)
