"""Wrongly typed Python API inputs get an rlt error naming the field and the allowed values (never
a raw TypeError, never silently accepted): LLM.generate's arguments, SamplingParams numbers given
as booleans, special-token ids in config.json."""

from __future__ import annotations

import functools
import json
import os

import pytest

from rlt_runtime import LLM, ConfigError, RequestError, SamplingParams
from rlt_runtime.models.checkpoint import load_config

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "configs")


@functools.lru_cache(maxsize=None)
def llm() -> LLM:
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4)


@pytest.mark.parametrize("prompts", [5, None, 1.5, b"abc", {"a", "b"}], ids=["int", "None", "float", "bytes", "set"])
def test_generate_rejects_prompts_of_the_wrong_type(prompts):
    with pytest.raises(RequestError, match=r"^prompts must be a string, a list of token ids, .* got "
                                           + type(prompts).__name__):
        llm().generate(prompts, use_tqdm=False)


@pytest.mark.parametrize("params", [5, {"temperature": 0}, [5], "greedy"], ids=["int", "dict", "list-of-int", "str"])
def test_generate_rejects_sampling_params_of_the_wrong_type(params):
    with pytest.raises(RequestError, match=r"^sampling_params must be None, a SamplingParams or a list of them"):
        llm().generate(["hi"], params, use_tqdm=False)
    assert not llm().engine.has_unfinished_requests()


def test_generate_takes_a_token_id_tuple_as_one_prompt():
    out = llm().generate((5, 6, 7), SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    assert len(out) == 1 and out[0].prompt_token_ids == [5, 6, 7]


@pytest.mark.parametrize("field,allowed", [("top_p", r"a number in \(0, 1\]"), ("min_p", r"a number in \[0, 1\]"),
                                           ("temperature", r"a number in \[0, 100\]"),
                                           ("exit_threshold", r"a number in \[0, 1\]")])
@pytest.mark.parametrize("value", [True, False])
def test_sampling_numbers_reject_booleans(field, allowed, value):
    """True == 1 and False == 0 in Python; a boolean probability is a client bug, not a value."""
    with pytest.raises(ConfigError, match=rf"^{field} must be {allowed}, got {value}"):
        SamplingParams(**{field: value})


def _config(tmp_path, name, **fields):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        data = {**json.load(f), **fields}
    (tmp_path / "config.json").write_text(json.dumps(data))
    return load_config(str(tmp_path))


@pytest.mark.parametrize("name,field,value", [
    ("ouro-1.4b.json", "eos_token_id", "x"), ("ouro-1.4b.json", "eos_token_id", ["x"]),
    ("ouro-1.4b.json", "eos_token_id", []), ("ouro-1.4b.json", "eos_token_id", True),
    ("ouro-1.4b.json", "eos_token_id", 2.0), ("ouro-1.4b.json", "eos_token_id", -1),
    ("ouro-1.4b.json", "eos_token_id", None), ("ouro-1.4b.json", "bos_token_id", 1.5),
    ("huginn-0125.json", "eos_token_id", [65505, "65508"]), ("huginn-0125.json", "pad_token_id", "pad"),
    ("huginn-0125.json", "bos_token_id", -65504),
])
def test_special_token_ids_must_be_non_negative_integers(tmp_path, name, field, value):
    with pytest.raises(ConfigError, match=rf"config\.json: field '{field}' = .* must be a token id"):
        _config(tmp_path, name, **{field: value})


def test_eos_token_id_may_be_a_list(tmp_path):
    assert _config(tmp_path, "ouro-1.4b.json", eos_token_id=[0, 2]).eos_token_ids == (0, 2)
