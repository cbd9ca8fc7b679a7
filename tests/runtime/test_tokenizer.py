"""Built-in and checkpoint tokenizers, chat templates, incremental detokenization."""

import json
import os

import pytest
import torch
from hypothesis import assume, given, settings, strategies as st

from rlt_runtime.engine.text import TextTracker
from rlt_runtime.errors import CheckpointError, RequestError
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.models.tokenizer import (HUGINN_SPECIALS, OURO_SPECIALS, IncrementalDetokenizer, builtin_tokenizer,
                                          load_tokenizer)

OURO = builtin_tokenizer(preset_config("ouro-tiny"))
HUGINN = builtin_tokenizer(preset_config("huginn-tiny"))
# U+FFFD is what gets held back; lone surrogates are not text (encode rejects them, tested below).
TEXT = st.text(st.characters(exclude_characters="\ufffd", exclude_categories=("Cs",)), max_size=20)
SAMPLE = "Grüße, 世界! 🎉🧪 naïve\tcafé\n\x00\x7f end"


@settings(max_examples=40)
@given(st.text(max_size=40))
def test_any_text_round_trips(text):
    """Text without special-token names (those encode to the special token itself) round-trips."""
    assume(not any(name in text for name in OURO_SPECIALS + HUGINN_SPECIALS))
    for tok in (OURO, HUGINN):
        ids = tok.encode(text, add_special_tokens=False)
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text


def test_every_byte_is_one_token():
    ids = OURO.encode(SAMPLE)
    assert len(ids) == len(SAMPLE.encode("utf-8")) and OURO.decode(ids) == SAMPLE
    assert OURO.encode("A") == [3 + ord("A")]  # bytes start after the 3 Ouro specials
    assert HUGINN.encode("A", add_special_tokens=False) == [ord("A")]


def test_ouro_special_layout():
    assert OURO.vocab_size == 320 and OURO.bos_token_id == 0
    assert OURO.eos_token_ids == (0,) and OURO.chat_stop_token_ids == (2,)
    assert OURO.encode("<|endoftext|><|im_start|><|im_end|>") == [0, 1, 2]
    assert OURO.encode("hi") == OURO.encode("hi", add_special_tokens=False)  # GPT-2 style: no BOS added


def test_huginn_special_layout():
    top = 320 - 32
    assert HUGINN.bos_token_id == top and HUGINN.eos_token_ids == (top + 1, top + 4)
    assert HUGINN.chat_stop_token_ids == (top + 4,)
    names = "<|begin_text|><|end_text|><|begin_header|><|end_header|><|end_turn|><|pad|>"
    assert HUGINN.encode(names, add_special_tokens=False) == list(range(top, top + 6))
    assert HUGINN.encode("hi") == [top] + HUGINN.encode("hi", add_special_tokens=False)  # BOS prepended


def test_real_vocab_huginn_ids_match_the_model():
    tok = builtin_tokenizer(preset_config("huginn-0125"))
    assert tok.vocab_size == 65536 and tok.bos_token_id == 65504
    assert tok.eos_token_ids == (65505, 65508) and tok.chat_stop_token_ids == (65508,)
    assert tok.decode([65535, 300], skip_special_tokens=False) == "<|reserved_65535|><|reserved_300|>"


@pytest.mark.parametrize("tok", [OURO, HUGINN], ids=["ouro", "huginn"])
def test_every_id_decodes(tok):
    specials = set(range(3)) if tok is OURO else set(range(288, 294))
    for i in range(tok.vocab_size):
        text = tok.decode([i])
        raw = tok.decode([i], skip_special_tokens=False)
        is_byte = (3 <= i < 259) if tok is OURO else i < 256
        if is_byte:
            assert text == raw and len(text) == 1
        else:
            assert text == ""
            assert raw.startswith("<|") and raw.endswith("|>")
            assert (i in specials) != raw.startswith("<|reserved_")


def test_chat_templates_render():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "2+2?"}]
    assert OURO.has_chat_template and HUGINN.has_chat_template
    assert OURO.apply_chat_template(messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert HUGINN.apply_chat_template(messages[:2], add_generation_prompt=False) == (
        "<|begin_text|><|begin_header|>system<|end_header|>\n\nBe brief.<|end_turn|>"
        "<|begin_header|>user<|end_header|>\n\nHi<|end_turn|>")
    rendered = HUGINN.apply_chat_template(messages)
    assert rendered.endswith("<|begin_header|>Huginn<|end_header|>\n\nHello<|end_turn|><|begin_header|>user"
                             "<|end_header|>\n\n2+2?<|end_turn|><|begin_header|>Huginn<|end_header|>\n\n")
    ids = HUGINN.encode(rendered, add_special_tokens=False)
    assert ids[0] == HUGINN.bos_token_id and ids[-3] == 288 + 3  # ... <|end_header|> \n \n


@pytest.mark.parametrize("messages, field", [
    ([{"content": "x"}], r"messages\[0\] has no 'role' field"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}],
     r"messages\[1\]\['content'\] must be a string"),
    ([{"role": "", "content": "a"}], r"messages\[0\]\['role'\] must be a non-empty string"),
    (["hello"], r"messages\[0\] must be an object"),
    ([], "non-empty list"),
])
def test_malformed_messages_name_the_field(messages, field):
    with pytest.raises(RequestError, match=field):
        OURO.apply_chat_template(messages)


def test_saved_tokenizer_reloads_identically(tmp_path):
    cfg = preset_config("huginn-tiny")
    save_checkpoint(str(tmp_path), cfg, preset_weights(cfg), tokenizer=HUGINN)
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(tmp_path))
    assert "<|begin_header|>" in json.load(open(tmp_path / "tokenizer_config.json"))["chat_template"]
    tok = load_tokenizer(str(tmp_path), cfg)
    assert (tok.vocab_size, tok.bos_token_id, tok.eos_token_ids, tok.chat_stop_token_ids) == (
        HUGINN.vocab_size, HUGINN.bos_token_id, HUGINN.eos_token_ids, HUGINN.chat_stop_token_ids)
    assert tok.encode(SAMPLE) == HUGINN.encode(SAMPLE) and tok.decode(tok.encode(SAMPLE)) == SAMPLE
    messages = [{"role": "user", "content": "hey"}]
    assert tok.apply_chat_template(messages) == HUGINN.apply_chat_template(messages)
    assert [tok.decode([i]) for i in range(320)] == [HUGINN.decode([i]) for i in range(320)]


# tokenizer_class values transformers 4.x resolves for a tokenizer.json-only checkpoint (its class
# map has no "TokenizersBackend", the name 5.x writes, so 4.x fails on that one).
TRANSFORMERS_4_FAST_CLASSES = {"PreTrainedTokenizerFast"}


@pytest.mark.parametrize("preset,builtin", [("ouro-tiny", OURO), ("huginn-tiny", HUGINN)])
def test_saved_tokenizer_loads_with_auto_tokenizer(tmp_path, preset, builtin):
    from transformers import AutoTokenizer

    cfg = preset_config(preset)
    save_checkpoint(str(tmp_path), cfg, preset_weights(cfg), tokenizer=builtin)
    config = json.load(open(tmp_path / "tokenizer_config.json"))
    assert config["tokenizer_class"] in TRANSFORMERS_4_FAST_CLASSES
    auto = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert auto.encode(SAMPLE) == builtin.encode(SAMPLE)
    assert auto.decode(builtin.encode(SAMPLE), skip_special_tokens=True) == SAMPLE
    messages = [{"role": "user", "content": "hey"}]
    assert auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == \
        builtin.apply_chat_template(messages)


def test_checkpoint_without_tokenizer_files(tmp_path):
    cfg = preset_config("ouro-tiny")
    assert load_tokenizer(str(tmp_path), cfg) is None
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        load_tokenizer(str(tmp_path), cfg)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: cannot load tokenizer"):
        load_tokenizer(str(tmp_path), cfg)


def _stream(tok, ids, prompt_ids=None):
    detok = IncrementalDetokenizer(tok, prompt_ids)
    deltas = [detok.add(i) for i in ids]
    return deltas, detok.flush()


@pytest.mark.parametrize("tok", [OURO, HUGINN], ids=["ouro", "huginn"])
def test_incremental_detokenizer_never_splits_characters(tok):
    ids = tok.encode(SAMPLE, add_special_tokens=False)
    deltas, rest = _stream(tok, ids)
    assert "".join(deltas) == SAMPLE and rest == ""
    assert all("\ufffd" not in d for d in deltas)
    # The four bytes of 🎉 arrive one token at a time: nothing is emitted until the last one.
    start = len("Grüße, 世界! ".encode("utf-8"))
    assert deltas[start:start + 4] == ["", "", "", "🎉"]


@pytest.mark.parametrize("tok", [OURO, HUGINN], ids=["ouro", "huginn"])
@pytest.mark.parametrize("chunk", [2, 3, 7, 1000])
def test_incremental_detokenizer_batches_equal_single_adds(tok, chunk):
    """add_many (queued tokens decoded together) gives the text of the single adds, also when a
    batch ends inside a multi-byte character."""
    prompt = tok.encode("日本")
    ids = tok.encode(SAMPLE, add_special_tokens=False)
    single, rest = _stream(tok, ids, prompt)
    detok = IncrementalDetokenizer(tok, prompt)
    batched = [detok.add_many(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    assert "".join(batched) + detok.flush() == "".join(single) + rest == SAMPLE


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("specials", [True, False], ids=["with-specials", "text-ids"])
def test_incremental_detokenizer_batches_of_random_ids(seed, specials):
    """Random ids (byte tokens that form broken and unfinished characters; skipped specials) in
    random batch sizes give the text of the single adds, at a bounded number of decodes per batch
    (a one-by-one fallback, or a scan back over every id, made finishing a request of random
    output cost milliseconds)."""
    g = torch.Generator().manual_seed(seed)
    pool = [i for i in range(OURO.vocab_size) if specials or OURO.decode([i], True)]
    ids = [pool[i] for i in torch.randint(0, len(pool), (300,), generator=g).tolist()]
    single, rest = _stream(OURO, ids)
    calls = [0]

    class Counting:
        def decode(self, ids, skip_special_tokens=True):
            calls[0] += 1
            return OURO.decode(ids, skip_special_tokens)

    detok = IncrementalDetokenizer(Counting())
    batched, i = [], 0
    while i < len(ids):
        n = int(torch.randint(1, 40, (1,), generator=g))
        before = calls[0]
        batched.append(detok.add_many(ids[i:i + n]))
        assert calls[0] - before <= 1 + IncrementalDetokenizer._MAX_CUTS, (n, calls[0] - before)
        i += n
    assert "".join(batched) + detok.flush() == "".join(single) + rest


def test_incremental_detokenizer_with_prompt_specials_and_flush():
    prompt = OURO.encode("日本")
    ids = OURO.encode("語<|im_end|>x", add_special_tokens=False)
    deltas, rest = _stream(OURO, ids, prompt_ids=prompt)
    assert "".join(deltas) + rest == "語x" and rest == ""
    # An incomplete character at the end comes out (as U+FFFD) only on flush.
    partial = OURO.encode("é")[:1]
    deltas, rest = _stream(OURO, OURO.encode("ok") + partial)
    assert "".join(deltas) == "ok" and rest == "\ufffd"


def test_text_tracker_reports_a_stop_string_completed_by_the_flush():
    """Bytes of an incomplete character are held back until the final flush; a stop string they
    complete is reported by `finish` (not only cut from the text)."""
    prompt = OURO.encode("日本")
    tracker = TextTracker(OURO, ["k\ufffd"], prompt)
    assert [tracker.add(t) for t in OURO.encode("ok") + OURO.encode("é")[:1]] == [None, None, None]
    assert tracker.text == "ok"
    assert tracker.finish() == "k\ufffd" and tracker.text == "o" and tracker.stopped_by == "k\ufffd"
    plain = TextTracker(OURO, ["zz"], prompt)
    for t in OURO.encode("ok") + OURO.encode("é")[:1]:
        plain.add(t)
    assert plain.finish() is None and plain.text == "ok\ufffd"


@settings(max_examples=25)
@given(TEXT, TEXT)
def test_incremental_detokenizer_equals_full_decode(prompt_text, text):
    prompt = HUGINN.encode(prompt_text) if prompt_text else None
    ids = HUGINN.encode(text, add_special_tokens=False)
    deltas, rest = _stream(HUGINN, ids, prompt)
    assert "".join(deltas) + rest == text and all("\ufffd" not in d for d in deltas) and rest == ""


def test_lone_surrogates_are_rejected_clearly():
    with pytest.raises(RequestError, match="valid Unicode"):
        HUGINN.encode("ok \ud800 no")


def test_chat_template_jinja_file_is_the_checkpoints_template(tmp_path):
    """A checkpoint may keep its template in chat_template.jinja instead of tokenizer_config.json;
    transformers reads it, and extra template variables reach it."""
    cfg = preset_config("ouro-tiny")
    tok = builtin_tokenizer(cfg)
    tok._hf.chat_template = None
    tok.save(str(tmp_path))
    assert "chat_template" not in json.load(open(tmp_path / "tokenizer_config.json"))
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ greeting }}")
    loaded = load_tokenizer(str(tmp_path), cfg)
    messages = [{"role": "user", "content": "hi"}]
    assert loaded.apply_chat_template(messages, template_kwargs={"greeting": "!"}) == "<user>hi!"
    with pytest.raises(RequestError, match=r"chat_template_kwargs may not set \['tokenize'\]"):
        loaded.apply_chat_template(messages, template_kwargs={"tokenize": True})
