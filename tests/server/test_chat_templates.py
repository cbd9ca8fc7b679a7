"""Chat templates and reasoning over HTTP: the checkpoint's template (tokenizer_config.json) rendered
by transformers, the --chat-template override, chat_template_kwargs, add_generation_prompt,
continue_final_message, and `reasoning_content` split off answers (non-streaming and streaming).

The server runs a scripted tiny Ouro checkpoint: every layer's output projections are zero, so the
residual stream is the current token's embedding and the LM head alone picks the next token; its
rows make greedy decoding follow a fixed successor chain. After any prompt ending in "\\n" the model
writes SCRIPT and then <|im_end|>, so the split of a known answer can be checked exactly. Prompts
are compared with transformers' own AutoTokenizer.apply_chat_template on the saved checkpoint."""

from __future__ import annotations

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")
from transformers import AutoTokenizer  # noqa: E402

from rlt_runtime import LLM, SamplingParams  # noqa: E402
from rlt_runtime.engine.llm_engine import LLMEngine  # noqa: E402
from rlt_runtime.errors import ConfigError  # noqa: E402
from rlt_runtime.entrypoints.server.chat_template import check_chat_template, load_chat_template  # noqa: E402
from rlt_runtime.models.checkpoint import save_checkpoint  # noqa: E402
from rlt_runtime.models.presets import preset_config, preset_weights  # noqa: E402
from rlt_runtime.models.tokenizer import builtin_tokenizer  # noqa: E402

MODEL = "ouro-tiny"  # the served name the test servers use
ENGINE_DEFAULTS = dict(dtype="float32", device="cpu", max_num_seqs=16, num_blocks=512, max_model_len=128)

SCRIPT = "ab</think>OK"  # distinct characters: each has one successor
IM_END = 2
# A thinking model's template: the generation prompt pre-fills <think> unless enable_thinking is false.
THINKING_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and not enable_thinking -%}{{ '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else -%}{{ '<think>\\n' }}{%- endif -%}{%- endif -%}"
)
PLAIN_TEMPLATE = (
    "{%- for message in messages -%}{{ '[' + message['role'] + ']\\n' + message['content'] + '\\n' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '[assistant]\\n' }}{%- endif -%}"
)
USER = [{"role": "user", "content": "Why?"}]


def _byte_id(ch: str) -> int:
    return 3 + ord(ch)  # the built-in Ouro tokenizer: bytes from id 3


def _scripted_weights(cfg, chain: list[int]) -> dict:
    """ouro-tiny weights whose greedy next token after chain[i] is chain[i + 1], whatever the context."""
    weights = dict(preset_weights(cfg, seed=3))
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = torch.zeros_like(weights[name])
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen)
    head = torch.zeros(cfg.vocab_size, cfg.hidden_size)
    for prev, nxt in zip(chain, chain[1:]):
        head[nxt] = 10 * embed[prev] / embed[prev].norm()
    weights["model.embed_tokens.weight"], weights["lm_head.weight"] = embed, head
    return weights


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    cfg = preset_config("ouro-tiny")
    tok = builtin_tokenizer(cfg)
    tok._hf.chat_template = THINKING_TEMPLATE
    path = tmp_path_factory.mktemp("thinking-ckpt")
    chain = [_byte_id("\n")] + [_byte_id(ch) for ch in SCRIPT] + [IM_END]
    save_checkpoint(str(path), cfg, _scripted_weights(cfg, chain), tokenizer=tok)
    return str(path)


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' own tokenizer of the saved checkpoint (the reference rendering)."""
    return AutoTokenizer.from_pretrained(checkpoint)


def _serve(start_server, checkpoint, **config):
    return start_server(engine_factory=lambda: LLMEngine(checkpoint, **ENGINE_DEFAULTS), **config)


@pytest.fixture(scope="module")
def thinking(start_server, checkpoint):
    """A server with the checkpoint's own (thinking) template and the default reasoning parser."""
    with _serve(start_server, checkpoint) as live:
        assert live.worker.wait_ready(60)
        yield live


@pytest.fixture
def submitted(thinking, monkeypatch) -> list:
    """The engine prompts ({"prompt_token_ids", "prompt"}) the thinking server's worker receives."""
    seen = []
    submit = thinking.worker.submit

    def spy(prompts, params, arrival_time):
        seen.extend(prompts)
        return submit(prompts, params, arrival_time)

    monkeypatch.setattr(thinking.worker, "submit", spy)
    return seen


def _client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _chat(live, stream=False, max_tokens=32, **body):
    return _client(live).chat.completions.create(model=MODEL, messages=body.pop("messages", USER), temperature=0,
                                                  max_completion_tokens=max_tokens, stream=stream, extra_body=body)


def _streamed(chunks) -> tuple[str, str]:
    reasoning = content = ""
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    return reasoning, content


def test_script_is_what_the_model_writes(checkpoint):
    """The fixture itself: after a newline the model writes SCRIPT, then <|im_end|>."""
    llm = LLM(checkpoint, **ENGINE_DEFAULTS)
    params = SamplingParams(max_tokens=32, temperature=0, stop_token_ids=[IM_END])
    out = llm.generate("any prompt\n", params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == [_byte_id(ch) for ch in SCRIPT] + [IM_END] and out.text == SCRIPT


@pytest.mark.parametrize("fields, kwargs", [
    ({}, {"add_generation_prompt": True}),
    ({"add_generation_prompt": False}, {"add_generation_prompt": False}),
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"add_generation_prompt": True, "enable_thinking": False}),
    ({"add_generation_prompt": False, "continue_final_message": True,
      "messages": USER + [{"role": "assistant", "content": "<think>\nI think"}]},
     {"add_generation_prompt": False, "continue_final_message": True}),
], ids=["default", "no-generation-prompt", "kwargs", "continue-final"])
def test_prompt_is_transformers_rendering(thinking, submitted, reference, fields, kwargs):
    messages = fields.get("messages", USER)
    want = reference.apply_chat_template(messages, tokenize=False, **kwargs)
    _chat(thinking, **fields)
    assert submitted[-1]["prompt"] == want
    assert submitted[-1]["prompt_token_ids"] == reference(want, add_special_tokens=False)["input_ids"]
    body = {"messages": messages, **{k: v for k, v in fields.items() if k != "messages"}}
    tokens = httpx.post(thinking.url + "/tokenize", json=body).json()["tokens"]
    assert tokens == submitted[-1]["prompt_token_ids"]


def test_reasoning_is_split_from_a_prefilled_think(thinking):
    resp = _chat(thinking)
    message = resp.choices[0].message
    assert (message.reasoning_content, message.content) == ("ab", "OK")
    assert resp.choices[0].finish_reason == "stop"
    chunks = list(_chat(thinking, stream=True))
    assert _streamed(chunks) == ("ab", "OK")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert not any("<" in (d.content or "") + (getattr(d, "reasoning_content", None) or "") for d in deltas)


def test_structured_output_starts_after_the_reasoning(thinking):
    """The prompt opens <think>: a constraint holds from the reasoning's end on (vLLM's rule), so the
    model reasons freely ("ab") and the content is the constrained answer, streamed alike; without
    the reasoning gate the choice would be forced from the first token, inside the reasoning."""
    for constraint in ({"guided_choice": ["OK", "NO"]}, {"guided_regex": "O[A-Z]"},
                       {"structured_outputs": {"choice": ["NO", "OK"]}}):
        message = _chat(thinking, **constraint).choices[0].message
        assert (message.reasoning_content, message.content) == ("ab", "OK")
        assert _streamed(_chat(thinking, stream=True, **constraint)) == ("ab", "OK")
    off = _chat(thinking, guided_choice=["OK", "NO"], chat_template_kwargs={"enable_thinking": False})
    assert off.choices[0].message.content in ("OK", "NO")  # no open reasoning: constrained from the start


def test_answer_cut_inside_a_marker_keeps_its_text(thinking):
    """max_tokens ends the answer at "ab</": the held-back "</" is reasoning text, also when streamed."""
    resp = _chat(thinking, max_tokens=4)
    assert resp.choices[0].finish_reason == "length"
    assert (resp.choices[0].message.reasoning_content, resp.choices[0].message.content) == ("ab</", "")
    assert _streamed(_chat(thinking, stream=True, max_tokens=4)) == ("ab</", "")


def test_template_kwargs_turn_thinking_off(thinking):
    """enable_thinking=False closes the think block in the prompt: the answer is all content."""
    resp = _chat(thinking, chat_template_kwargs={"enable_thinking": False})
    assert (resp.choices[0].message.reasoning_content, resp.choices[0].message.content) == (None, SCRIPT)
    assert _streamed(_chat(thinking, stream=True, chat_template_kwargs={"enable_thinking": False})) == ("", SCRIPT)


def test_continued_message_inside_think_stays_reasoning(thinking):
    """The continued assistant message opened <think>: its continuation starts in the reasoning."""
    messages = USER + [{"role": "assistant", "content": "<think>\na"}]  # the model goes on with "b</think>OK"
    resp = _chat(thinking, messages=messages, add_generation_prompt=False, continue_final_message=True)
    assert (resp.choices[0].message.reasoning_content, resp.choices[0].message.content) == ("b", "OK")
    assert _streamed(_chat(thinking, stream=True, messages=messages, add_generation_prompt=False,
                           continue_final_message=True)) == ("b", "OK")


def test_parser_none_keeps_markers_in_content(start_server, checkpoint):
    with _serve(start_server, checkpoint, reasoning_parser="none") as live:
        assert live.worker.wait_ready(60)
        message = _chat(live).choices[0].message
        assert (message.reasoning_content, message.content) == (None, SCRIPT)
        assert _streamed(_chat(live, stream=True)) == ("", SCRIPT)


def test_override_template_and_deepseek_r1(start_server, checkpoint, reference, tmp_path):
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN_TEMPLATE)
    template = load_chat_template(str(path))
    assert template == PLAIN_TEMPLATE and load_chat_template(PLAIN_TEMPLATE) == PLAIN_TEMPLATE
    with _serve(start_server, checkpoint, chat_template=template) as live:
        assert live.worker.wait_ready(60)
        tokens = httpx.post(live.url + "/tokenize", json={"messages": USER}).json()["tokens"]
        want = reference.apply_chat_template(USER, tokenize=False, add_generation_prompt=True,
                                             chat_template=PLAIN_TEMPLATE)
        assert want.startswith("[user]") and tokens == reference(want, add_special_tokens=False)["input_ids"]
        message = _chat(live).choices[0].message  # no <think> in this template: no parser by default
        assert (message.reasoning_content, message.content) == (None, SCRIPT)
    with _serve(start_server, checkpoint, chat_template=template, reasoning_parser="deepseek_r1") as live:
        assert live.worker.wait_ready(60)
        message = _chat(live).choices[0].message  # deepseek_r1: the answer starts in the reasoning
        assert (message.reasoning_content, message.content) == ("ab", "OK")
        assert _streamed(_chat(live, stream=True)) == ("ab", "OK")


def test_chat_template_option_errors(tmp_path):
    with pytest.raises(ConfigError, match="chat_template must be a file .* or an inline template"):
        load_chat_template(str(tmp_path / "missing.jinja"))
    with pytest.raises(ConfigError, match=r"chat_template is not a valid Jinja template \(line 1\)"):
        check_chat_template("{% for m in %}")
    from rlt_runtime.entrypoints.server import ServerConfig

    with pytest.raises(ConfigError, match="reasoning_parser must be None .* 'think', 'deepseek_r1', 'none'"):
        ServerConfig(reasoning_parser="qwen").validate()



DOCS_TEMPLATE = PLAIN_TEMPLATE + "{%- for d in documents or [] -%}{{ '(' + d['title'] + ': ' + d['text'] + ')' }}{%- endfor -%}"
DOCS = [{"title": "one", "text": "first"}, {"title": "two", "text": "second"}]


def test_a_requests_own_template_needs_trust(start_server, checkpoint, reference, thinking):
    """A request's chat_template (and documents) render as transformers renders them, on a server
    started with --trust-request-chat-template; elsewhere it is a 400 naming chat_template."""
    body = {"model": MODEL, "messages": USER, "chat_template": PLAIN_TEMPLATE, "max_completion_tokens": 2}
    for path, fields in (("/v1/chat/completions", body), ("/tokenize", {"messages": USER, "chat_template": "{{ 1 }}"})):
        err = httpx.post(thinking.url + path, json=fields).json()["error"]
        assert err["param"] == "chat_template" and "--trust-request-chat-template" in err["message"]
    with _serve(start_server, checkpoint, trust_request_chat_template=True) as live:
        assert live.worker.wait_ready(60)
        for template, docs in ((PLAIN_TEMPLATE, None), (DOCS_TEMPLATE, DOCS)):
            want = reference.apply_chat_template(USER, tokenize=False, add_generation_prompt=True,
                                                 chat_template=template, documents=docs)
            ids = reference(want, add_special_tokens=False)["input_ids"]
            fields = {"chat_template": template, "documents": docs}
            assert httpx.post(live.url + "/tokenize", json={"messages": USER, **fields}).json()["tokens"] == ids
            usage = httpx.post(live.url + "/v1/chat/completions", json={**body, **fields}).json()["usage"]
            assert usage["prompt_tokens"] == len(ids)
        assert "(one: first)(two: second)" in want
        default = httpx.post(live.url + "/tokenize", json={"messages": USER}).json()["tokens"]
        assert default == reference(reference.apply_chat_template(USER, tokenize=False, add_generation_prompt=True),
                                    add_special_tokens=False)["input_ids"]  # the checkpoint's, without one
        for bad, param in (({"chat_template": "{% for m in %}"}, "chat_template"),
                           ({"chat_template": DOCS_TEMPLATE, "documents": [{"title": 1}]}, "documents")):
            err = httpx.post(live.url + "/v1/chat/completions", json={**body, **bad}).json()["error"]
            assert err["param"].startswith(param), err


@pytest.mark.parametrize("value, text", [("{% for m in %}", "not a valid Jinja template"),
                                         ("no-such-file.jinja", "must be a file holding a Jinja template")])
def test_rlt_serve_refuses_a_bad_chat_template_before_loading(value, text, capsys):
    from rlt_runtime.entrypoints.server import cli as serve_cli

    assert serve_cli.main(["--model", "ouro-tiny", "--chat-template", value]) == 2
    assert text in capsys.readouterr().err


@pytest.mark.parametrize("body, param, text", [
    ({"add_generation_prompt": True, "continue_final_message": True}, "continue_final_message", "cannot both be true"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "may not set"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "may not set"),
    ({"chat_template_kwargs": ["x"]}, "chat_template_kwargs", "valid dictionary"),
    ({"add_generation_prompt": "yes"}, "add_generation_prompt", "valid boolean"),
])
def test_template_field_errors_name_the_field(thinking, body, param, text):
    resp = httpx.post(thinking.url + "/v1/chat/completions", json={"model": MODEL, "messages": USER, **body})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["param"] == param and text in err["message"]


def test_thinking_token_budget_ends_the_reasoning(thinking):
    """The prompt's reasoning holds one token ("\n" after <think>): with a budget of 2 the model
    writes "a", then "</think>" is forced and the model goes on after it ("OK")."""
    message = _chat(thinking, thinking_token_budget=2).choices[0].message
    assert (message.reasoning_content, message.content) == ("a", "OK")
    assert _streamed(_chat(thinking, stream=True, thinking_token_budget=2)) == ("a", "OK")
    message = _chat(thinking, thinking_token_budget=-1).choices[0].message  # no limit
    assert (message.reasoning_content, message.content) == ("ab", "OK")
    resp = httpx.post(thinking.url + "/v1/chat/completions",
                      json={"model": MODEL, "messages": USER, "thinking_token_budget": -2})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "thinking_token_budget"


def test_include_reasoning_false_leaves_the_reasoning_out(thinking):
    message = _chat(thinking, include_reasoning=False).choices[0].message
    assert (message.reasoning_content, message.content) == (None, "OK")
    assert _streamed(_chat(thinking, stream=True, include_reasoning=False)) == ("", "OK")


def test_reasoning_also_under_vllms_newer_name(thinking):
    """Current vLLM names the field `reasoning`: the same text goes out under both names."""
    body = {"model": MODEL, "messages": USER, "temperature": 0, "max_completion_tokens": 32}
    message = httpx.post(thinking.url + "/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    assert message["reasoning"] == message["reasoning_content"] == "ab"
    chunks = list(_chat(thinking, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices and getattr(c.choices[0].delta, "reasoning_content", None)]
    assert deltas and all(d.reasoning == d.reasoning_content for d in deltas)


def test_echo_puts_the_continued_assistant_message_first(thinking):
    """vLLM's chat echo: the answer starts with the last message when it is the assistant's; after a
    user message there is nothing to put first."""
    messages = USER + [{"role": "assistant", "content": "<think>\na"}]
    kw = dict(messages=messages, add_generation_prompt=False, continue_final_message=True)
    message = _chat(thinking, echo=True, **kw).choices[0].message
    assert (message.reasoning_content, message.content) == ("b", "<think>\naOK")
    assert _streamed(_chat(thinking, stream=True, echo=True, **kw)) == ("b", "<think>\naOK")
    message = _chat(thinking, echo=True).choices[0].message
    assert (message.reasoning_content, message.content) == ("ab", "OK")


def test_message_reasoning_under_either_name_reaches_the_template():
    from rlt_runtime.entrypoints.server.protocol import ApiError, ChatCompletionRequest

    def rendered(**fields):
        message = {"role": "assistant", "content": "x", **fields}
        return ChatCompletionRequest(model=MODEL, messages=[*USER, message]).template_messages()[-1]

    assert rendered(reasoning="r") == rendered(reasoning_content="r") == {"role": "assistant", "content": "x",
                                                                         "reasoning_content": "r"}
    assert rendered(reasoning="r", reasoning_content="r")["reasoning_content"] == "r"
    with pytest.raises(ApiError, match="reasoning and reasoning_content disagree"):
        rendered(reasoning="r", reasoning_content="s")


def test_responses_api_splits_the_reasoning_into_its_own_item(thinking):
    """/v1/responses: a reasoning item ("ab"), then the message ("OK"); the reasoning tokens are
    those through "</think>" (one byte token each), and streamed the reasoning item closes before
    the message opens."""
    client = _client(thinking)
    resp = client.responses.create(model=MODEL, input="Why?", temperature=0, max_output_tokens=32)
    reasoning, message = resp.output
    assert (reasoning.type, [c.text for c in reasoning.content]) == ("reasoning", ["ab"])
    assert (message.type, resp.output_text, resp.status) == ("message", "OK", "completed")
    assert resp.usage.output_tokens_details.reasoning_tokens == len("ab</think>")
    assert resp.usage.output_tokens == len(SCRIPT) + 1  # and <|im_end|>
    events = list(client.responses.create(model=MODEL, input="Why?", temperature=0, max_output_tokens=32, stream=True))
    kinds = [e.type for e in events]
    assert kinds.index("response.output_item.done") < [i for i, k in enumerate(kinds)
                                                       if k == "response.output_item.added"][1]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "ab"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "OK"
    assert [i.type for i in events[-1].response.output] == ["reasoning", "message"]
    cut = client.responses.create(model=MODEL, input="Why?", temperature=0, max_output_tokens=3)
    assert [i.type for i in cut.output] == ["reasoning", "message"] and cut.output_text == ""
    assert cut.status == "incomplete" and cut.usage.output_tokens_details.reasoning_tokens == 3
