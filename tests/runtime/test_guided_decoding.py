"""Guided decoding (structured output through xgrammar): the device mask against a per-token
reference, outputs of a random-weight model (which writes garbage unmasked) that parse and match
their constraint, EOS exactly when the grammar ends, batch invariance in an async crowd,
speculation (guided rows draft; their drafts are checked against the grammar), preemption and the
errors naming the field."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("xgrammar")

from rlt_runtime import LLM, GuidedDecoding, SamplingParams  # noqa: E402
from rlt_runtime.errors import ConfigError, RequestError  # noqa: E402
from rlt_runtime.executor.token_mask import (  # noqa: E402
    TokenMask, allowed_words, apply_token_bitmask, new_bitmask, restrict)
from test_logit_processing import _drive  # noqa: E402

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "y"]}},
          "required": ["a", "b"], "additionalProperties": False}
REGEX = "[a-c]{2}-[0-9]{2}"
CHOICES = ["yes", "no", "maybe"]
GRAMMAR = 'root ::= "(" [a-z] [a-z]? ")"'


def _check_schema(obj):
    try:
        import jsonschema
    except ImportError:  # the schema's rules by hand
        assert set(obj) == {"a", "b"} and isinstance(obj["a"], int) and 0 <= obj["a"] <= 99 and obj["b"] in "xy"
    else:
        jsonschema.validate(obj, SCHEMA)


# ---- the device mask -----------------------------------------------------------------------------

def test_bitmask_matches_a_per_token_reference_and_all_ones_is_bit_identical():
    torch.manual_seed(0)
    vocab = 70  # not a multiple of 32: the last word's high bits lie past the vocabulary
    words = torch.randint(-2**31, 2**31 - 1, (3, 3), dtype=torch.int64).to(torch.int32)
    words[2] = -1
    logits = torch.randn(3, vocab)
    got = apply_token_bitmask(logits, words)
    for r in range(3):
        for t in range(vocab):
            allowed = (int(words[r, t // 32]) >> (t % 32)) & 1
            assert got[r, t].item() == (logits[r, t].item() if allowed else -float("inf"))
    assert torch.equal(got[2], logits[2])


def _admitted(slot, allowed=None):
    return SimpleNamespace(slot=slot, params=SamplingParams(allowed_token_ids=allowed))


def _finite(row):
    return torch.isfinite(row).nonzero().flatten().tolist()


def test_slot_rows_follow_their_slots():
    """write() resets admitted slots to all ones (or to their allowed_token_ids) and sets guided
    slots' rows; apply() picks rows by slot."""
    mask = TokenMask(num_slots=6, vocab_size=40, device="cpu")
    rows = torch.zeros((2, 2), dtype=torch.int32)
    rows[0, 0], rows[1, 1] = 1 << 3, 1 << 2  # slot 4 allows token 3, slot 1 allows token 34
    mask.write([_admitted(0), _admitted(1), _admitted(4, [5]), _admitted(5, [0, 31, 32, 39])], [4, 1], rows)
    logits = torch.randn(4, 40)
    got = mask.apply(logits, torch.tensor([1, 0, 4, 5]))
    assert _finite(got[0]) == [34]
    assert torch.equal(got[1], logits[1])
    assert _finite(got[2]) == [3]  # the host's guided row (it intersects a grammar's with allowed ids)
    assert _finite(got[3]) == [0, 31, 32, 39] and torch.equal(got[3, [0, 31, 32, 39]], logits[3, [0, 31, 32, 39]])
    mask.write([_admitted(4), _admitted(5)], [], None)  # new requests without allowed ids or a grammar
    assert torch.equal(mask.apply(logits[2:], torch.tensor([4, 5])), logits[2:])


def test_allowed_ids_intersect_a_grammars_mask_unless_that_leaves_nothing():
    masks = torch.zeros((3, 2), dtype=torch.int32)
    masks[0, 0], masks[1, 1], masks[2] = (1 << 3) | (1 << 4), 1 << 2, -1
    restrict(masks, allowed_words([4, 9, 33], 40))
    assert [_finite(apply_token_bitmask(torch.zeros(1, 40), masks[i:i + 1])[0]) for i in range(3)] == [
        [4], [34], [4, 9, 33]]  # row 1 shares no token with the allowed ids: the grammar's row stays


def test_grammar_wins_over_the_requests_own_bans():
    """A row whose processed logits leave no grammar token (min_tokens holding back the only
    allowed EOS) takes the grammar's mask over the raw logits; other rows are unchanged."""
    mask = TokenMask(num_slots=2, vocab_size=40, device="cpu")
    rows = torch.zeros((2, 2), dtype=torch.int32)
    rows[0, 0] = 1 << 5  # slot 0: only token 5 (say, EOS) can end the grammar
    rows[1, 0] = (1 << 5) | (1 << 7)
    mask.write([_admitted(0), _admitted(1)], [0, 1], rows)
    raw = torch.randn(2, 40)
    processed = raw.clone()
    processed[:, 5] = -float("inf")  # min_tokens bans EOS in both rows
    got = mask.apply(processed, torch.tensor([0, 1]), raw)
    assert torch.isfinite(got[0]).nonzero().flatten().tolist() == [5] and got[0, 5] == raw[0, 5]
    assert torch.isfinite(got[1]).nonzero().flatten().tolist() == [7] and got[1, 7] == raw[1, 7]


# ---- outputs -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def llm():
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4)


def _run(llm, guided, temperature=0.0, max_tokens=24, **kw):
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=7, guided=guided, **kw)
    return llm.generate(["Answer:"], params, use_tqdm=False)[0].outputs


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_output_parses_and_validates(llm, temperature):
    out = _run(llm, {"json": SCHEMA}, temperature)[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.engine._eos  # EOS once the object closed
    _check_schema(json.loads(out.text))


def test_length_bounded_strings_hold_no_raw_control_characters(llm):
    """xgrammar writes strings with minLength/maxLength with a class that admits U+0000-U+001F
    (JSON forbids them); the grammars compiled here do not, so strict json.loads takes every output."""
    schema = {"type": "object", "properties": {"q": {"type": "string", "maxLength": 5},
                                               "r": {"type": "string", "minLength": 1, "maxLength": 3}},
              "required": ["q", "r"], "additionalProperties": False}
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, guided={"json": schema}) for s in range(8)]
    for out in llm.generate(["Look"] * 8, params, use_tqdm=False):
        value = json.loads(out.outputs[0].text)  # strict: raw control characters in a string fail
        assert isinstance(value["q"], str) and value["r"]


def test_unguided_output_is_not_json(llm):
    """The check above has teeth: the random-weight model writes garbage without the mask."""
    out = llm.generate(["Answer:"], SamplingParams(max_tokens=24, temperature=1.0, seed=7), use_tqdm=False)[0].outputs[0]
    with pytest.raises(ValueError):
        json.loads(out.text)


def test_json_object_regex_choice_and_grammar(llm):
    close = llm.engine.tokenizer.encode("}", add_special_tokens=False)[0]  # favoured: the mask must put "{" first
    obj = _run(llm, GuidedDecoding(json_object=True), 1.0, logit_bias={close: 8.0})[0]
    assert obj.finish_reason == "stop" and isinstance(json.loads(obj.text), dict)
    for out in _run(llm, {"regex": REGEX}, 1.0, n=3):
        assert re.fullmatch(REGEX, out.text) and out.finish_reason == "stop"
    assert {o.text for o in _run(llm, {"choice": CHOICES}, 1.0, n=4)} <= set(CHOICES)
    out = _run(llm, {"grammar": GRAMMAR}, 1.0)[0]
    assert re.fullmatch(r"\([a-z][a-z]?\)", out.text) and out.finish_reason == "stop"


STRUCTURE = {"begin": "<f>", "schema": SCHEMA, "end": "</f>"}


def _bias(llm, favour=None):
    """logit_bias against whitespace (a structural tag's JSON allows it anywhere, and the random
    model favours it), and for the text `favour`'s first token."""
    first = [llm.engine.tokenizer.encode(c, add_special_tokens=False)[0] for c in (" ", "\n", "\r", "\t")]
    bias = {t: -100.0 for t in first}
    if favour is not None:
        bias[llm.engine.tokenizer.encode(favour, add_special_tokens=False)[0]] = 30.0
    return bias


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_structural_tag_in_xgrammars_format_is_the_whole_output(llm, temperature):
    tag = {"type": "structural_tag", "format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                                "content": {"type": "json_schema", "json_schema": SCHEMA}}}
    out = _run(llm, {"structural_tag": tag}, temperature, max_tokens=40, logit_bias=_bias(llm))[0]
    body = re.fullmatch("<f>(.*)</f>", out.text, re.S)
    assert out.finish_reason == "stop" and body
    _check_schema(json.loads(body.group(1)))


def test_structural_tag_in_vllms_form_constrains_every_triggered_segment(llm):
    """Free text until a trigger ("<", favoured), then the structure from its begin through JSON
    its schema validates to its end, again and again until max_tokens; unguided, the favoured "<"
    only repeats."""
    tag = {"structures": [STRUCTURE], "triggers": ["<"]}
    bias = _bias(llm, favour="<")
    for out in _run(llm, {"structural_tag": tag}, 1.0, max_tokens=60, n=2, logit_bias=bias):
        assert out.finish_reason == "length" and out.text.startswith("<f>")
        *complete, last = out.text.split("<f>")[1:]
        assert len(complete) >= 2 and "</f>" not in last
        for segment in complete:
            assert segment.endswith("</f>")
            _check_schema(json.loads(segment[: -len("</f>")]))
    free = llm.generate(["Answer:"], SamplingParams(max_tokens=20, temperature=1.0, seed=7, logit_bias=bias),
                        use_tqdm=False)[0].outputs[0]
    assert "<f>" not in free.text


@pytest.mark.parametrize("kind,value,check", [
    ("json", SCHEMA, lambda t: _check_schema(json.loads(t)) is None),
    ("regex", REGEX, lambda t: re.fullmatch(REGEX, t)),
    ("choice", CHOICES, lambda t: t in CHOICES),
    ("grammar", GRAMMAR, lambda t: re.fullmatch(r"\([a-z][a-z]?\)", t)),
    ("structural_tag", {"format": {"type": "tag", "begin": "<f>", "end": "</f>",
                                   "content": {"type": "json_schema", "json_schema": SCHEMA}}},
     lambda t: t.startswith("<f>") and t.endswith("</f>") and _check_schema(json.loads(t[3:-4])) is None),
])
def test_after_lets_any_text_come_first(llm, kind, value, check):
    """With `after`, the text is free until the marker ("!", favoured so the random model writes it
    soon), and from there on follows the constraint; EOS only once it is complete."""
    bias = {**_bias(llm), llm.engine.tokenizer.encode("!", add_special_tokens=False)[0]: 4.0}
    for out in _run(llm, {kind: value, "after": "!"}, 1.0, max_tokens=80, n=2, logit_bias=bias):
        head, marker, tail = out.text.partition("!")
        assert marker and head and check(tail), out.text  # free text before "!" (some), the constraint after
        assert out.finish_reason == "stop"


def test_after_is_part_of_the_constraint():
    """`after` changes what compiles (a cache key of its own) and is checked."""
    assert GuidedDecoding(json=SCHEMA).cache_key() != GuidedDecoding(json=SCHEMA, after="</think>").cache_key()
    with pytest.raises(ConfigError, match="^guided: after must be a non-empty string"):
        GuidedDecoding(json=SCHEMA, after="")


def test_min_tokens_cannot_hold_a_finished_grammar(llm):
    """min_tokens holds back EOS, but a choice that is complete can only end: the grammar wins and
    the request stops (finish_reason stop) with a valid choice before min_tokens."""
    for out in _run(llm, {"choice": CHOICES}, 1.0, n=3, min_tokens=12):
        assert out.text in CHOICES and out.finish_reason == "stop" and len(out.token_ids) < 12


def test_eos_only_when_the_grammar_can_end(llm):
    """A strongly favoured EOS is held back until the regex is complete, then taken at once."""
    eos = llm.engine._eos[0]
    out = _run(llm, {"regex": "[a-z]{5}"}, 0.0, logit_bias={eos: 50.0})[0]
    assert len(out.token_ids) == 6 and out.token_ids[-1] == eos and re.fullmatch("[a-z]{5}", out.text)


# ---- invariance, speculation, preemption --------------------------------------------------------

def test_guided_and_unguided_requests_in_an_async_crowd_match_running_alone():
    plain = SamplingParams(max_tokens=10, temperature=0.9, seed=4, logprobs=1, ignore_eos=True)
    guided = SamplingParams(max_tokens=16, temperature=0.9, seed=3, logprobs=1, guided={"regex": REGEX})
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4)
    plain_alone = _drive(llm, [([40, 41, 42], plain, 0)])[0]
    guided_alone = _drive(llm, [([9, 10, 11], guided, 0)])[0]
    crowded = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, async_scheduling=True)
    _drive(crowded, [([9, 10, 11], guided, 0)])  # leaves its mask in the slot `plain` takes next
    crowd = _drive(crowded, [([40, 41, 42], plain, 0), ([9, 10, 11], guided, 1), ([7, 7, 7], plain, 2)])
    assert crowd[0] == plain_alone and crowd[2][0] == _drive(llm, [([7, 7, 7], plain, 0)])[0][0]
    assert crowd[1] == guided_alone


def test_async_guided_steps_build_masks_while_the_forward_runs(monkeypatch):
    """With async steps and no speculation, a decode step after a guided step submits its forward,
    then processes the step before and builds its guided rows' masks, then samples: the host work
    overlaps the forward. Outputs (tokens and log-probabilities, guided rows finishing at
    different steps among unguided ones) are those of synchronous steps, and parse."""
    from rlt_runtime.engine.llm_engine import LLMEngine
    from rlt_runtime.executor.model_runner import ModelRunner

    events = []
    program, sampling, process = ModelRunner.decode_program, ModelRunner.decode_sampling, LLMEngine._process

    def logged(name, fn, late_arg=None):
        def call(self, *args, **kwargs):
            if late_arg is None or (len(args) > late_arg and args[late_arg]):
                events.append(name)
            return fn(self, *args, **kwargs)
        return call

    monkeypatch.setattr(ModelRunner, "decode_program", logged("forward before masks", program, late_arg=5))
    monkeypatch.setattr(ModelRunner, "decode_sampling", logged("sample", sampling))
    monkeypatch.setattr(LLMEngine, "_process", logged("process", process))
    guided = [SamplingParams(max_tokens=64, temperature=t, seed=3 + i, logprobs=1, guided=g)
              for i, (t, g) in enumerate([(0.9, {"regex": REGEX}), (0.0, {"choice": CHOICES}),
                                          (0.8, {"json": SCHEMA})])]
    plain = SamplingParams(max_tokens=9, temperature=0.9, seed=8, logprobs=1, ignore_eos=True)
    work = [([9, 10, 11], guided[0], 0), ([40, 41], plain, 0), ([5, 6, 7], guided[1], 1), ([3, 3], guided[2], 2),
            ([7, 7, 7], plain, 3)]
    sync = _drive(LLM("ouro-tiny", dtype="float32", max_num_seqs=4, max_model_len=256), work)
    assert "forward before masks" not in events
    overlapped = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, max_model_len=256, async_scheduling=True)
    assert _drive(overlapped, work) == sync
    order = "".join({"forward before masks": "f", "process": "p", "sample": "s"}[e] for e in events)
    assert "fps" in order, order
    text = [overlapped.engine.tokenizer.decode(sync[i][0], skip_special_tokens=True) for i in (0, 2, 3)]
    assert re.fullmatch(REGEX, text[0]) and text[1] in CHOICES
    _check_schema(json.loads(text[2]))


def _spec(policy="fixed", d=1):
    return {"num_speculative_tokens": 3, "draft_loops": d, "draft_policy": policy}


def _valid(tokenizer, work, outputs):
    """Each output (`_drive`'s) parses as / matches the constraint of its (guided) request in `work`."""
    for i, (_, params, _) in enumerate(work):
        text = tokenizer.decode(outputs[i][0], skip_special_tokens=True)
        guided = params.guided
        if guided.json is not None:
            _check_schema(json.loads(text))
        else:
            assert re.fullmatch(guided.regex, text), (guided.regex, text)


def _drafted_and_accepted(llm):
    """Drafts were made and some accepted (so verify positions past the first chose committed tokens)."""
    st = llm.stats()["speculative"]
    return st["drafted"] > 0 and st["accepted"] > 0


@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_greedy_guided_speculation_is_plain_guided_decoding(model, policy):
    """Guided rows draft, their drafts are checked against the grammar and every verify position
    gets its own mask: the tokens (and log-probabilities) of plain guided decoding."""
    guided = [SamplingParams(max_tokens=28, temperature=0, logprobs=1, guided={"json": SCHEMA}),
              SamplingParams(max_tokens=16, temperature=0, logprobs=1, guided={"regex": REGEX}),
              SamplingParams(max_tokens=24, temperature=0, logprobs=1, guided={"regex": "[a-z]{3,9}"})]
    work = [([5, 6, 7], guided[0], 0), ([9, 10, 11], guided[1], 0), ([40, 41], guided[2], 1)]
    want = _drive(LLM(model, dtype="float32", max_num_seqs=4), work)
    spec = LLM(model, dtype="float32", max_num_seqs=4, speculative_config=_spec(policy))
    assert _drive(spec, work) == want
    assert _drafted_and_accepted(spec)
    _valid(spec.engine.tokenizer, work, want)


@pytest.mark.parametrize("speculative", [False, True])
def test_allowed_token_ids_narrow_a_grammar(speculative):
    """A guided request with allowed_token_ids writes only tokens both allow (the host intersects
    the grammar's masks, also those of checked drafts); under speculation, the tokens of plain decoding."""
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4)
    tok = llm.engine.tokenizer
    letters = [tok.encode(c, add_special_tokens=False)[0] for c in "abc"]
    params = [SamplingParams(max_tokens=12, temperature=t, seed=2, logprobs=1, guided={"regex": "[a-z]{3,9}"},
                             allowed_token_ids=letters + list(llm.engine._eos)) for t in (0.0, 1.0)]
    work = [([5, 6, 7], params[0], 0), ([40, 41], params[1], 1), ([9, 10], params[0], 1)]
    want = _drive(llm, work)
    for i in range(3):
        assert re.fullmatch("[abc]{3,9}", tok.decode(want[i][0], skip_special_tokens=True))
    if speculative:
        spec = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=_spec(d=3))
        assert _drive(spec, work)[0] == want[0]
        assert spec.stats()["speculative"]["drafted"] > 0


@pytest.mark.parametrize("model", ["ouro-tiny", "huginn-tiny"])
def test_sampled_guided_speculation_is_valid_reproducible_and_batch_invariant(model):
    """Seeded sampled guided requests under speculation: grammar-valid, the same alone, again and in
    an async crowd with unguided rows, which in turn get their outputs of running alone."""
    opts = dict(dtype="float32", max_num_seqs=4, speculative_config=_spec())
    guided = [SamplingParams(max_tokens=28, temperature=0.9, seed=3, logprobs=1, guided={"json": SCHEMA}),
              SamplingParams(max_tokens=24, temperature=0.9, seed=8, logprobs=1, guided={"regex": "[a-z]{3,9}"})]
    plain = SamplingParams(max_tokens=10, temperature=0.9, seed=4, logprobs=1, ignore_eos=True)
    work = [([5, 6, 7], guided[0], 0), ([40, 41], guided[1], 0)]
    llm = LLM(model, **opts)
    alone = _drive(llm, work)
    assert _drafted_and_accepted(llm)
    _valid(llm.engine.tokenizer, work, alone)
    assert _drive(llm, work) == alone
    plain_alone = _drive(llm, [([40, 41, 42], plain, 0)])[0]
    crowded = LLM(model, async_scheduling=True, **opts)
    crowd = _drive(crowded, [([40, 41, 42], plain, 0), work[0], (work[1][0], work[1][1], 2)])
    assert crowd[0] == plain_alone and crowd[1] == alone[0] and crowd[2] == alone[1]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_and_async_steps_keep_guided_speculation_exact(mode):
    """Greedy guided rows drafting in a pool too small for them all (preempted, by recompute or
    swap) and with async steps: the outputs of plain guided decoding."""
    prompts = [list(range(5, 30)), [40, 41, 42], list(range(60, 95)), [7, 8, 9, 10, 11]]
    params = SamplingParams(max_tokens=14, temperature=0, logprobs=1, guided={"regex": "[a-z]{6,12}"})
    options = dict(dtype="float32", max_num_seqs=4, block_size=16, enable_prefix_caching=False)
    work = [(p, params, 0) for p in prompts]
    want = _drive(LLM("ouro-tiny", **options), work)
    tight = LLM("ouro-tiny", num_blocks=16, preemption_mode=mode, async_scheduling=True, speculative_config=_spec(),
                **options)
    assert _drive(tight, work) == want
    assert tight.engine.stats()["preemptions"] > 0 and _drafted_and_accepted(tight)
    _valid(tight.engine.tokenizer, work, want)


def test_synthetic_acceptance_leaves_guided_requests_undrafted_and_valid():
    """The benchmark aid accepts drafts unchecked: guided rows do not draft there (else they would
    commit tokens their grammar rejects and be aborted)."""
    spec = {**_spec(), "synthetic_acceptance": 1.0}
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4, speculative_config=spec)
    out = _run(llm, {"regex": REGEX}, 0.0)[0]
    assert out.finish_reason == "stop" and re.fullmatch(REGEX, out.text)
    assert llm.stats()["speculative"]["drafted"] == 0


def test_draft_checks_mask_each_verify_position_and_roll_back():
    """`_check_drafts` against fresh matchers fed the committed output and drafts: row j is the
    mask after drafts 1..j while the grammar takes them, all ones after a rejected draft or a
    drafted EOS; the matchers end holding the committed output only."""
    eng = LLM("ouro-tiny", dtype="float32", max_num_seqs=2).engine
    grammar = eng._compile_guided(SamplingParams(guided={"regex": REGEX}))
    ids = lambda text: eng.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731

    def matcher(tokens):
        m = eng._grammars.matcher(grammar, list(eng._eos))
        assert all(m.accept_token(t) for t in tokens)
        return m

    def mask(m):
        out = new_bitmask(1, eng.model_config.vocab_size)
        m.fill_next_token_bitmask(out, 0)
        return out[0]

    committed = ids("a")
    ended = ids("b-12") + [eng._eos[0]] + ids("a")  # the grammar ends with EOS; the draft after it is never checked
    rejected = ids("c") + ids("x") + ids("2")  # "x" is rejected: "-" must follow
    rows = [SimpleNamespace(matcher=matcher(committed), allowed_words=None) for _ in range(2)]
    got = eng._check_drafts(rows, {0: ended, 1: rejected})
    taken = len(ended) - 2
    for j in range(taken + 1):
        assert torch.equal(got[0][j], mask(matcher(committed + ended[:j])))
    assert torch.equal(got[1][0], mask(matcher(committed))) and torch.equal(got[1][1], mask(matcher(committed + ids("c"))))
    assert (got[0][taken + 1:] == -1).all() and (got[1][2:] == -1).all()
    assert got[0].shape[0] == len(ended) + 1 and got[1].shape[0] == len(rejected) + 1
    for row in rows:
        assert not row.matcher.is_terminated() and torch.equal(mask(row.matcher), mask(matcher(committed)))


# ---- validation --------------------------------------------------------------------------------

@pytest.mark.parametrize("guided,match", [
    ({}, "guided must set exactly one"),
    ({"regex": "a", "choice": ["a"]}, "guided must set exactly one"),
    ({"json": "{not json"}, "guided: the json text is not valid JSON"),
    ({"choice": []}, "guided: choice must be"),
    ({"choice": ["a", 3]}, "guided: choice must be"),
    ({"regx": "a"}, "guided has unknown keys"),
    ({"structural_tag": {"structures": [STRUCTURE]}}, "guided: a structural tag needs 'structures' and 'triggers'"),
    ({"structural_tag": {"structures": [], "triggers": ["<"]}}, "guided: structural tag structures must be"),
    ({"structural_tag": {"structures": [{"begin": "<f>", "end": 3}], "triggers": ["<"]}},
     "guided: structural tag structures must be"),
    ({"structural_tag": {"structures": [dict(STRUCTURE, schema="{}")], "triggers": ["<"]}},
     "guided: structural tag structures must be"),
    ({"structural_tag": {"structures": [STRUCTURE], "triggers": [""]}}, "guided: structural tag triggers must be"),
    ({"structural_tag": {"type": "tag", "format": {}}}, "guided: a structural tag's type must be 'structural_tag'"),
    ({"structural_tag": {"format": {}, "triggers": ["<"]}}, "guided: xgrammar's structural tag is"),
    ({"structural_tag": '{"format": 3}'}, "guided: xgrammar's structural tag is"),
    ("[0-9]+", "guided must be None"),
])
def test_sampling_params_errors_name_the_field(guided, match):
    with pytest.raises(ConfigError, match=f"^{re.escape(match)}"):
        SamplingParams(guided=guided)


@pytest.mark.parametrize("guided,match", [
    ({"regex": "(ab"}, "guided: invalid regex"),
    ({"json": {"type": "object", "properties": {"a": {"type": "frobnicate"}}}}, "guided: invalid json"),
    ({"grammar": "root ::= "}, "guided: invalid grammar"),
    ({"structural_tag": {"structures": [STRUCTURE], "triggers": ["["]}}, "guided: invalid structural tag"),
    ({"structural_tag": {"format": {"type": "frobnicate"}}}, "guided: invalid structural tag"),
])
def test_grammars_that_do_not_compile_name_the_field(llm, guided, match):
    with pytest.raises(RequestError, match=f"^{match}"):
        llm.engine.add_request("bad", [5, 6], SamplingParams(guided=guided))
