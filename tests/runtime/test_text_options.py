"""Output-text options: skip_special_tokens=False keeps special tokens in the text;
include_stop_str_in_output=True keeps the matched stop string (generation still ends there)."""

from __future__ import annotations

from dataclasses import replace

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.engine.text import TextTracker
from rlt_runtime.models.presets import preset_config
from rlt_runtime.models.tokenizer import builtin_tokenizer

OURO = builtin_tokenizer(preset_config("ouro-tiny"))
IM_START = 1  # a special token of the built-in Ouro tokenizer


def _text(tokens: list[int], **options) -> str:
    tracker = TextTracker(OURO, [], OURO.encode("x"), **options)
    for t in tokens:
        tracker.add(t)
    tracker.finish()
    return tracker.text


def test_skip_special_tokens():
    tokens = OURO.encode("ab", add_special_tokens=False) + [IM_START] + OURO.encode("c", add_special_tokens=False)
    assert _text(tokens) == "abc"
    assert _text(tokens, skip_special_tokens=False) == "ab<|im_start|>c"


def test_include_stop_str_in_output():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=2)
    base = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, skip_special_tokens=False)
    text = llm.generate([[5, 6, 7]], base, use_tqdm=False)[0].outputs[0].text
    stop = text[4:6]
    cut = text.index(stop)
    plain, kept = llm.generate([[5, 6, 7], [5, 6, 7]], [
        replace(base, stop=[stop]), replace(base, stop=[stop], include_stop_str_in_output=True)], use_tqdm=False)
    assert plain.outputs[0].text == text[:cut] and plain.outputs[0].finish_reason == "stop"
    assert kept.outputs[0].text == text[:cut + len(stop)] and kept.outputs[0].finish_reason == "stop"
    assert kept.outputs[0].token_ids == plain.outputs[0].token_ids
