"""Offline chat (`LLM.chat`, vLLM's API): conversations rendered by transformers' own
`apply_chat_template` on the saved tokenizer (the independent reference), generated as those
token ids would be, one output per conversation in order, the template's end-of-turn token
stopping generation (not with ignore_eos), and bad messages named by their field."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.errors import RequestError

GREEDY = SamplingParams(temperature=0, max_tokens=6)
OTHER_TEMPLATE = "{%- for m in messages -%}{{ m['role'] + ': ' + m['content'] + '\\n' }}{%- endfor -%}{{ 'bot:' }}"


@pytest.fixture(scope="module")
def llm():
    return LLM("ouro-tiny", dtype="float32", max_num_seqs=4)


@pytest.fixture(scope="module")
def reference(llm, tmp_path_factory):
    """transformers' tokenizer of the same files."""
    path = tmp_path_factory.mktemp("chat-tokenizer")
    llm.tokenizer.save(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def _rendered(reference, messages, **kw) -> tuple[str, list[int]]:
    text = reference.apply_chat_template(messages, tokenize=False, **kw)
    return text, reference(text, add_special_tokens=False)["input_ids"]


def test_a_conversation_is_generated_from_its_rendering(llm, reference):
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    text, ids = _rendered(reference, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
                          add_generation_prompt=True)
    out = llm.chat(messages, GREEDY, use_tqdm=False)
    assert len(out) == 1 and out[0].prompt == text and out[0].prompt_token_ids == ids
    want = llm.generate([ids], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=[2]), use_tqdm=False)[0]
    assert out[0].outputs[0].token_ids == want.outputs[0].token_ids and out[0].outputs[0].text == want.outputs[0].text


def test_conversations_come_back_in_order_with_the_template_options(llm, reference):
    user = [{"role": "user", "content": "Why?"}]
    partial = user + [{"role": "assistant", "content": "Because"}]
    outs = llm.chat([user, partial], [GREEDY, SamplingParams(temperature=0, max_tokens=3)], use_tqdm=False,
                    add_generation_prompt=False, continue_final_message=False, chat_template_kwargs={"unused": 1})
    assert [o.prompt for o in outs] == [_rendered(reference, c, add_generation_prompt=False)[0] for c in (user, partial)]
    assert len(outs[1].outputs[0].token_ids) <= 3
    cont = llm.chat(partial, GREEDY, use_tqdm=False, add_generation_prompt=False, continue_final_message=True)[0]
    assert cont.prompt == _rendered(reference, partial, add_generation_prompt=False, continue_final_message=True)[0]
    assert cont.prompt.endswith("Because")
    own = llm.chat(user, GREEDY, use_tqdm=False, chat_template=OTHER_TEMPLATE)[0]
    assert own.prompt == "user: Why?\nbot:"


def test_the_end_of_turn_token_stops_chat_unless_eos_is_ignored(llm):
    favour_end = {2: 100.0}  # <|im_end|>, the template's end of turn
    out = llm.chat([{"role": "user", "content": "x"}], SamplingParams(temperature=0, max_tokens=5, logit_bias=favour_end),
                   use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [2] and out.finish_reason == "stop" and out.text == ""
    out = llm.chat([{"role": "user", "content": "x"}], SamplingParams(temperature=0, max_tokens=5, logit_bias=favour_end,
                                                                      ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


@pytest.mark.parametrize("messages,match", [
    ([{"role": "user"}], r"^messages\[0\]\.content must be"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
     r"^messages\[0\]\.content\[0\]: content type 'image_url' is not supported"),
    ([{"role": "user", "content": "hi", "images": []}], r"^messages\[0\] has unknown keys \['images'\]"),
    ([{"role": "tool", "content": "42"}], r"^messages\[0\]\.tool_call_id: a tool message needs the id"),
    ([{"role": "user", "content": "x", "tool_call_id": "c1"}], r"^messages\[0\]\.tool_call_id: only tool messages"),
    ([[{"role": "user", "content": "ok"}], [{"content": "no role"}]], r"^messages\[1\]\[0\]\.role must be"),
    ([{"role": "assistant", "content": "x", "reasoning": "a", "reasoning_content": "b"}], r"disagree"),
    ([], r"^messages must be a non-empty list"),
])
def test_bad_messages_name_the_field(llm, messages, match):
    with pytest.raises(RequestError, match=match):
        llm.chat(messages, GREEDY, use_tqdm=False)
