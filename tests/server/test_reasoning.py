"""The reasoning splitter against a whole-text reference: any cut of the answer into deltas gives
the reference split, markers never leak into either field."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from rlt_runtime.entrypoints.server.reasoning import ReasoningSplitter, template_mentions_thinking

PIECES = ["<think>", "</think>", "<", "</", "</th", "think", ">", "a", "b\n", " "]
ANSWERS = st.lists(st.sampled_from(PIECES), max_size=12).map("".join)
PROMPTS = st.sampled_from(["user: hi\nassistant:", "assistant:<think>\n", "<think>x</think>\nassistant:",
                           "<think>a</think><think>"])


def reference_split(parser: str, prompt: str, text: str):
    """The split of a whole answer: (reasoning or None, content)."""
    inside = parser == "deepseek_r1" or prompt.rfind("<think>") > prompt.rfind("</think>")
    if text.startswith("<think>"):
        text, inside = text[len("<think>"):], True
    if not inside:
        return None, text
    reasoning, _, content = text.partition("</think>")
    return reasoning or None, content


@given(st.sampled_from(["think", "deepseek_r1"]), PROMPTS, ANSWERS, st.lists(st.integers(0, 80), max_size=8))
def test_any_cut_gives_the_reference_split(parser, prompt, text, cuts):
    splitter = ReasoningSplitter(parser, prompt)
    reasoning = content = ""
    bounds = sorted({min(c, len(text)) for c in cuts} | {len(text)})
    start = 0
    for end in bounds:
        r, c = splitter.feed(text[start:end])
        reasoning, content, start = reasoning + r, content + c, end
    r, c = splitter.finish()
    reasoning, content = reasoning + r, content + c
    assert (reasoning or None, content) == reference_split(parser, prompt, text)
    assert ReasoningSplitter(parser, prompt).split(text) == reference_split(parser, prompt, text)


@pytest.mark.parametrize("parser, prompt, text, want", [
    ("think", "assistant:", "<think>ab</think>OK", ("ab", "OK")),  # the answer opens the reasoning
    ("think", "assistant:<think>\n", "ab</think>OK", ("ab", "OK")),  # the prompt pre-filled <think>
    ("think", "assistant:", "ab</think>OK", (None, "ab</think>OK")),  # never opened: all content
    ("think", "<think>", "a</think>b<think>c</think>", ("a", "b<think>c</think>")),  # only the first block
    ("deepseek_r1", "assistant:", "ab</think>OK", ("ab", "OK")),
    ("deepseek_r1", "", "<think>ab", ("ab", "")),
])
def test_known_splits_one_character_at_a_time(parser, prompt, text, want):
    splitter = ReasoningSplitter(parser, prompt)
    parts = [splitter.feed(ch) for ch in text] + [splitter.finish()]
    assert ("".join(r for r, _ in parts) or None, "".join(c for _, c in parts)) == want
    assert ReasoningSplitter(parser, prompt).split(text) == want


def test_thinking_templates_are_recognised():
    assert template_mentions_thinking("{{ '<think>\\n' }}")
    assert template_mentions_thinking({"default": "x", "thinking": "<think>"})
    assert not template_mentions_thinking("{{ messages }}") and not template_mentions_thinking(None)
