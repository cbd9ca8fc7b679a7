"""Stop strings: the automaton equals a naive matcher, its cost per character does not grow with
the number of stop strings, and a request's stop list is bounded (max_stop_strings, max_stop_chars)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import example, given, settings, strategies as st

from rlt_runtime import LLM, ConfigError, RequestError, SamplingParams
from rlt_runtime.engine.stop_matcher import StopAutomaton, StopMatcher
from rlt_runtime.engine.text import TextTracker
from rlt_runtime.models.presets import preset_config
from rlt_runtime.models.tokenizer import IncrementalDetokenizer, builtin_tokenizer

OURO = builtin_tokenizer(preset_config("ouro-tiny"))
# A small alphabet (with a multi-byte character) so that stop strings overlap and match often.
ALPHABET = "abcé"
STOPS = st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=1, max_size=8)
PIECES = st.lists(st.text(ALPHABET, max_size=4), max_size=25)
# Two letters: stop strings that are suffixes of one another's prefixes (deep failure chains).
BINARY_STOPS = st.lists(st.text("ab", min_size=1, max_size=7), min_size=1, max_size=12)
BINARY_PIECES = st.lists(st.text("ab", max_size=3), max_size=30)


def naive_stop(pieces: list[str], stops: list[str], first_live: int = 0):
    """Reference: after each piece, every occurrence of every stop string that ends inside the
    piece; the one starting first (ties: first in the list) cuts the text. Pieces before index
    first_live (the text of the first min_tokens tokens) stop nothing; an occurrence ending in a
    later piece may start in them.
    Returns (index of the stopping piece or None, text, stop string or None)."""
    text = ""
    for k, piece in enumerate(pieces):
        before = len(text)
        text += piece
        hits = [(i, j) for j, s in enumerate(stops) for i in range(len(text) - len(s) + 1)
                if text.startswith(s, i) and i + len(s) > before]
        if hits and k >= first_live:
            i, j = min(hits)
            return k, text[:i], stops[j]
    return None, text, None


def naive_pending(text: str, stops: list[str], whole: bool = False) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string (or the whole
    string: a match min_tokens held back is held back in the text too, until the next token)."""
    return max((k for s in stops for k in range(1, len(s) + whole) if text.endswith(s[:k])), default=0)


@settings(max_examples=300, deadline=None)
@given(st.one_of(STOPS, BINARY_STOPS), st.one_of(PIECES, BINARY_PIECES))
@example(["abcxq", "bcy", "cxz"], ["abcx", "z"])  # "cxz" is found through two failure moves
def test_matcher_equals_the_naive_reference(stops, pieces):
    matcher = StopMatcher(StopAutomaton(stops))
    want_k, want_text, want_stop = naive_stop(pieces, stops)
    text = ""
    for k, piece in enumerate(pieces):
        hit = matcher.scan(piece)
        text += piece
        if hit is not None:
            start, stop = hit
            assert (k, text[:start], stop) == (want_k, want_text, want_stop)
            return
        assert matcher.pending == naive_pending(text, stops)
    assert want_k is None


@settings(max_examples=150, deadline=None)
@given(STOPS, st.text(ALPHABET, max_size=30), st.booleans(), st.sampled_from([0, 0, 1, 3, 8]))
@example(["ab"], "abab", False, 1)  # the first "ab" ends in token 2: the match ending in token 4 stops
@example(["abc"], "abcd", False, 2)  # starts in the held tokens, ends after them: it stops
def test_tracker_equals_the_naive_reference_token_by_token(stops, text, cut_last_char, min_tokens):
    """Byte tokens: a multi-byte character arrives over several tokens; ending inside one leaves
    bytes that only the final flush emits (as U+FFFD), which may complete a stop string too.
    min_tokens: matches ending in the first min_tokens tokens' text do not stop (vLLM's rule)."""
    prompt = OURO.encode("p")
    ids = OURO.encode(text, add_special_tokens=False)
    if cut_last_char and text.endswith("é"):
        ids = ids[:-1]
        stops = stops + [text[-2:-1] + "\ufffd"] if len(text) > 1 else stops
    detok = IncrementalDetokenizer(OURO, prompt)
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    # Piece k belongs to token k + 1; the flush to the last token.
    first_live = min_tokens if min_tokens < len(ids) else len(pieces)
    want_k, want_text, want_stop = naive_stop(pieces, stops, first_live)
    tracker = TextTracker(OURO, stops, prompt, min_tokens=min_tokens)
    shown = ""
    for k, t in enumerate(ids):
        hit = tracker.add(t)
        if k == want_k:
            assert hit == want_stop
            break
        assert hit is None
        stable = tracker.stable_text(False)
        assert shown == stable[:len(shown)]  # streamed text is never taken back
        shown = stable
        last_text = max((j for j in range(k + 1) if pieces[j]), default=-1)  # the piece the text ends in
        assert len(tracker.text) - len(stable) == naive_pending(tracker.text, stops, whole=last_text < first_live)
    else:
        assert tracker.finish() == want_stop
    assert (tracker.text, tracker.stopped_by) == (want_text, want_stop)
    assert tracker.stable_text(True) == want_text


@pytest.mark.parametrize("num_stops", [1, 10, 3000])
def test_state_moves_per_character_do_not_grow_with_the_stop_strings(num_stops):
    """Counted state moves, not time. Adversarial stop strings (long runs of one letter ending in
    different letters) keep partial matches alive at every character; the scan still takes at most
    two moves per character (one edge, amortized at most one failure move)."""
    letters = [chr(0x4E00 + i) for i in range(num_stops)]
    stops = [("a" * (1 + i % 40)) + letters[i] for i in range(num_stops)]
    matcher = StopMatcher(StopAutomaton(stops))
    text = ("a" * 37 + "b") * 50
    for ch in text:
        assert matcher.scan(ch) is None
    assert matcher.scanned == len(text) and matcher.steps <= 2 * len(text)


class _CountedStr(str):
    """A stop string that counts the times its characters or length are read."""

    reads = 0

    def __len__(self):
        _CountedStr.reads += 1
        return super().__len__()

    def __getitem__(self, key):
        _CountedStr.reads += 1
        return super().__getitem__(key)

    def __iter__(self):
        _CountedStr.reads += 1
        return super().__iter__()


def test_tokens_do_not_revisit_the_stop_strings():
    """After the automaton is built, feeding tokens and streaming stable text never reads a stop
    string again (re-checking each stop string per token costs O(stop characters) per token)."""
    stops = [_CountedStr("a" * 20 + chr(0x4E00 + i)) for i in range(200)]
    prompt = OURO.encode("p")
    tracker = TextTracker(OURO, stops, prompt)
    _CountedStr.reads = 0
    for t in OURO.encode("a" * 30 + "b" + "a" * 10, add_special_tokens=False):
        assert tracker.add(t) is None
        tracker.stable_text(False)
    assert tracker.stable_text(False) == "a" * 30 + "b"  # the trailing a's may still start a stop string
    assert _CountedStr.reads == 0


@functools.lru_cache(maxsize=None)
def llm(**options) -> LLM:
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4, **options)


def test_default_limits_accept_128_strings_and_4096_characters():
    m = llm()
    p = dict(max_tokens=4, temperature=0, ignore_eos=True)
    ok = m.generate([[5, 6, 7]], SamplingParams(stop=["x" * 31 + chr(0x4E00 + i) for i in range(128)], **p),
                    use_tqdm=False)[0].outputs[0]
    assert ok.finish_reason == "length"
    with pytest.raises(RequestError, match=r"^stop has 129 strings .* at most 128 .*max_stop_strings"):
        m.generate([[5, 6, 7]], SamplingParams(stop=[chr(0x4E00 + i) for i in range(129)], **p), use_tqdm=False)
    with pytest.raises(RequestError, match=r"^stop has 4097 characters .* at most 4096 .*max_stop_chars"):
        m.generate([[5, 6, 7]], SamplingParams(stop=["x" * 4000, "y" * 97], **p), use_tqdm=False)
    assert not m.engine.has_unfinished_requests()


def test_limits_are_engine_options():
    m = llm(max_stop_strings=2, max_stop_chars=6)
    p = dict(max_tokens=2, temperature=0, ignore_eos=True)
    assert m.generate([[5, 6]], SamplingParams(stop=["abc", "def"], **p), use_tqdm=False)[0].finished
    with pytest.raises(RequestError, match="at most 2 .*max_stop_strings"):
        m.generate([[5, 6]], SamplingParams(stop=["a", "b", "c"], **p), use_tqdm=False)
    with pytest.raises(RequestError, match="stop has 7 characters .* at most 6 .*max_stop_chars"):
        m.generate([[5, 6]], SamplingParams(stop="abcdefg", **p), use_tqdm=False)
    for name, bad in (("max_stop_strings", 0), ("max_stop_chars", -1), ("max_stop_strings", True)):
        with pytest.raises(ConfigError, match=f"^{name} must be an integer >= 1"):
            LLM("ouro-tiny", dtype="float32", **{name: bad})


def test_many_stop_strings_stop_where_the_matching_one_occurs():
    """127 decoys and the probe: the request stops at the probe, as with the probe alone."""
    m = llm()
    p = dict(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    text = m.generate(["text"], SamplingParams(**p), use_tqdm=False)[0].outputs[0].text
    probe = text[4:6]
    decoys = ["\u4e00" * 28 + chr(0x4E00 + i) + probe[:1] for i in range(127)]
    alone = m.generate(["text"], SamplingParams(stop=[probe], **p), use_tqdm=False)[0].outputs[0]
    many = m.generate(["text"], SamplingParams(stop=decoys + [probe], **p), use_tqdm=False)[0].outputs[0]
    assert (many.text, many.finish_reason, many.stop_reason) == (alone.text, "stop", probe)
    assert many.text == text[:text.index(probe)]


def test_min_tokens_hold_back_stop_strings_as_vllm_does():
    """A stop string that occurs in the text of the first min_tokens tokens does not end the
    request; the first occurrence ending after them does (ignore_eos: min_tokens changes no token)."""
    m = llm()
    p = dict(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    out = m.generate(["text"], SamplingParams(**p), use_tqdm=False)[0].outputs[0]
    detok = IncrementalDetokenizer(OURO, OURO.encode("text"))
    pieces = [detok.add(t) for t in out.token_ids]  # the final flush's characters are left out
    stop = out.text[2:3]  # a character that occurs early, and (found below) again after min_tokens
    early = naive_stop(pieces, [stop])[0]
    for min_tokens in range(early + 1, len(pieces)):
        k, want_text, _ = naive_stop(pieces, [stop], first_live=min_tokens)
        if k is not None:
            break
    else:
        pytest.fail(f"{stop!r} does not occur again in {out.text!r}")
    got = m.generate(["text"], SamplingParams(stop=[stop], min_tokens=min_tokens, **p), use_tqdm=False)[0].outputs[0]
    assert (got.text, got.finish_reason, got.stop_reason) == (want_text, "stop", stop)
    assert len(got.token_ids) == k + 1 > min_tokens and got.token_ids == out.token_ids[:k + 1]
    assert len(want_text) > out.text.index(stop)  # it went past the first occurrence


def test_one_automaton_per_sampling_params(monkeypatch):
    """A prompt list with n samples each, sharing one SamplingParams, builds the automaton once
    (building it per prompt or per sample would multiply the engine thread's work)."""
    import rlt_runtime.sampling_params as sampling_params

    built = []

    class Counted(StopAutomaton):
        def __init__(self, stops):
            built.append(list(stops))
            super().__init__(stops)

    monkeypatch.setattr(sampling_params, "StopAutomaton", Counted)
    p = SamplingParams(n=2, max_tokens=3, temperature=1.0, seed=1, ignore_eos=True, stop=["\u4e00\u4e01", "zz"])
    outs = llm().generate([[5, 6], [7, 8], [9, 10]], p, use_tqdm=False)
    assert all(len(o.outputs) == 2 and o.finished for o in outs)
    assert built == [["\u4e00\u4e01", "zz"]]
