"""Reasoning parsers: split a chat answer's text into `reasoning_content` (between `<think>` and
`</think>`) and `content`, while it streams.

Parsers (`--reasoning-parser`):

* `think`: the answer starts inside the reasoning when the prompt ends inside an open `<think>`
  block (a template that pre-fills `<think>` in the generation prompt, as thinking models'
  templates do), or when the answer itself opens with `<think>`; otherwise it is all content;
* `deepseek_r1` (vLLM's name): the answer always starts inside the reasoning (an opening `<think>`
  is dropped if the model writes it);
* `none`: no split.

Reasoning ends at the first `</think>`; everything after it is content, markers included. The
markers themselves are never part of either field. Without `</think>` an answer that started in
the reasoning is all reasoning (cut off by `max_tokens`, say).
"""

from __future__ import annotations

from typing import Optional

from ...engine.thinking_budget import THINK_END, THINK_START
REASONING_PARSERS = ("think", "deepseek_r1", "none")


def prompt_opens_reasoning(prompt: str) -> bool:
    """Whether the rendered prompt ends inside an open `<think>` block."""
    return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)


def template_mentions_thinking(template) -> bool:
    """Whether a chat template (a string, or a {name: template} dict) writes `<think>` markers."""
    sources = template.values() if isinstance(template, dict) else [template]
    return any(isinstance(t, str) and THINK_START in t for t in sources)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest proper prefix of `marker` that `text` ends with."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class ReasoningSplitter:
    """Splits one answer's text deltas into (reasoning, content) deltas.

    `feed(text)` returns the newly settled (reasoning, content); text that may still turn out to be
    part of a marker is held back until `feed` or `finish` settles it. The concatenations of the
    deltas equal `split(whole text)` however the text was cut into deltas.
    """

    def __init__(self, parser: str, prompt: str):
        """parser: "think" or "deepseek_r1"; prompt: the rendered chat prompt the answer follows."""
        self._in_reasoning = parser == "deepseek_r1" or prompt_opens_reasoning(prompt)
        self._at_start = True  # a leading <think> may still open (or repeat) the reasoning
        self._held = ""

    def feed(self, text: str) -> tuple[str, str]:
        self._held += text
        reasoning = ""
        if self._at_start:
            if len(self._held) < len(THINK_START) and THINK_START.startswith(self._held):
                return "", ""
            if self._held.startswith(THINK_START):
                self._held = self._held[len(THINK_START):]
                self._in_reasoning = True
            self._at_start = False
        if self._in_reasoning:
            end = self._held.find(THINK_END)
            if end < 0:
                keep = _partial_suffix(self._held, THINK_END)
                reasoning, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
                return reasoning, ""
            reasoning, self._held = self._held[:end], self._held[end + len(THINK_END):]
            self._in_reasoning = False
        content, self._held = self._held, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is still held back, as (reasoning, content): the answer ended."""
        rest, self._held = self._held, ""
        self._at_start = False
        return (rest, "") if self._in_reasoning else ("", rest)

    def split(self, text: str) -> tuple[Optional[str], str]:
        """A whole answer as (reasoning or None when there is none, content)."""
        r1, c1 = self.feed(text)
        r2, c2 = self.finish()
        return (r1 + r2) or None, c1 + c2
