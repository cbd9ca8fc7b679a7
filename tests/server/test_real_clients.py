"""The client tools users point at rlt-serve, run end to end against a live server (ouro-tiny, fp32,
CPU): LangChain (langchain-openai's ChatOpenAI: invoke, stream, with_structured_output by
json_schema, json_mode and function calling, bind_tools, over chat completions and the Responses
API; its OpenAI completions LLM), LiteLLM (completion, plain and streamed; text_completion), the
OpenAI Agents SDK (an agent calling a function tool over the Responses API and over chat
completions) and the guidellm and aiperf benchmark CLIs (a short synchronous
synthetic run each, their JSON reports read back). Greedy answers equal the offline engine's for
the same prompt tokens; usage equals the tokens the server counts. Install the clients with
`pip install -e ".[clients]"`; each test skips when its client is missing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Literal

import httpx
import pydantic
import pytest

from rlt_runtime import SamplingParams

MODEL = "ouro-tiny"
QUESTION = "What is the capital of France?"
PROMPT = "Once upon"
MAX_TOKENS = 8
REQUESTS = 4  # per benchmark run
CLI_TIMEOUT = 300


class Verdict(pydantic.BaseModel):
    """Fields a random model fills in a few tokens: enums, a boolean and a one-digit integer."""
    color: Literal["red", "green", "blue"]
    ok: bool
    digit: int = pydantic.Field(ge=0, le=9)


class AnyObject(pydantic.BaseModel):
    """What json_mode guarantees: a JSON object, any keys."""
    model_config = pydantic.ConfigDict(extra="allow")


def chat_ids(server, messages: list[dict]) -> list[int]:
    return httpx.post(server.url + "/tokenize", json={"messages": messages}).json()["tokens"]


def offline_greedy(server, offline, prompt, chat: bool):
    """The offline engine's greedy output (text, token_ids) for `prompt` (text or token ids); chat
    stops on the template's end-of-turn tokens as the server's chat endpoint does."""
    stops = list(server.engine.tokenizer.chat_stop_token_ids) if chat else None
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, stop_token_ids=stops)
    return offline.generate([prompt], params, use_tqdm=False)[0].outputs[0]


@pytest.fixture(scope="module")
def chat_want(server, offline):
    """(prompt token ids, offline greedy output) of QUESTION as one user message."""
    ids = chat_ids(server, [{"role": "user", "content": QUESTION}])
    want = offline_greedy(server, offline, ids, chat=True)
    assert want.text  # the comparisons below are about real text
    return ids, want


@pytest.fixture(scope="module")
def completion_want(server, offline):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": PROMPT}).json()["tokens"]
    want = offline_greedy(server, offline, PROMPT, chat=False)
    assert want.text
    return ids, want


# --- LangChain -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def langchain_openai():
    return pytest.importorskip("langchain_openai")


def chat_model(langchain_openai, server, **kw):
    return langchain_openai.ChatOpenAI(base_url=server.url + "/v1", api_key="x", model=MODEL, max_retries=0,
                                       timeout=120, **{"max_tokens": MAX_TOKENS, "temperature": 0, **kw})


def test_langchain_chat_invoke(langchain_openai, server, chat_want):
    ids, want = chat_want
    msg = chat_model(langchain_openai, server).invoke(QUESTION)
    assert msg.content == want.text
    assert msg.response_metadata["finish_reason"] == want.finish_reason
    usage = msg.usage_metadata
    assert (usage["input_tokens"], usage["output_tokens"]) == (len(ids), len(want.token_ids))
    assert usage["total_tokens"] == len(ids) + len(want.token_ids)


def test_langchain_chat_stream(langchain_openai, server, chat_want):
    ids, want = chat_want
    chunks = list(chat_model(langchain_openai, server, stream_usage=True).stream(QUESTION))
    assert len([c for c in chunks if c.content]) > 1  # streamed, not one block
    assert "".join(c.content for c in chunks) == want.text
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert whole.content == want.text
    assert (whole.usage_metadata["input_tokens"], whole.usage_metadata["output_tokens"]) == (len(ids),
                                                                                             len(want.token_ids))


def test_langchain_over_the_responses_api(langchain_openai, server, chat_want):
    """ChatOpenAI(use_responses_api=True) sends /v1/responses: the same answer as chat, whole and
    streamed, with the usage it reports."""
    ids, want = chat_want
    llm = chat_model(langchain_openai, server, use_responses_api=True)
    msg = llm.invoke(QUESTION)
    assert msg.text == want.text
    assert (msg.usage_metadata["input_tokens"], msg.usage_metadata["output_tokens"]) == (len(ids), len(want.token_ids))
    chunks = list(llm.stream(QUESTION))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert whole.text == want.text


def test_langchain_structured_output_json_schema(langchain_openai, server):
    jsonschema = pytest.importorskip("jsonschema")
    llm = chat_model(langchain_openai, server, max_tokens=48)
    out = llm.with_structured_output(Verdict, method="json_schema", include_raw=True).invoke("A verdict")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Verdict)
    raw = out["raw"]
    assert raw.response_metadata["finish_reason"] == "stop"
    data = json.loads(raw.content)
    jsonschema.validate(data, Verdict.model_json_schema())
    assert list(data) == list(Verdict.model_fields)  # written in the schema's order
    assert Verdict(**data) == out["parsed"]


def test_langchain_structured_output_json_mode(langchain_openai, server):
    llm = chat_model(langchain_openai, server, max_tokens=48)
    out = llm.with_structured_output(AnyObject, method="json_mode", include_raw=True).invoke("Reply in JSON.")
    assert out["parsing_error"] is None and isinstance(out["parsed"], AnyObject)
    assert out["raw"].response_metadata["finish_reason"] == "stop"
    data = json.loads(out["raw"].content)
    assert isinstance(data, dict) and out["parsed"].model_dump() == data


def test_langchain_structured_output_function_calling(langchain_openai, server):
    """LangChain's function-calling structured output sends a named tool_choice and reads the call."""
    llm = chat_model(langchain_openai, server, max_tokens=48)
    out = llm.with_structured_output(Verdict, method="function_calling", include_raw=True).invoke("A verdict")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Verdict)
    (call,) = out["raw"].tool_calls
    assert call["name"] == "Verdict" and Verdict(**call["args"]) == out["parsed"]


def test_langchain_function_calling_over_the_responses_api(langchain_openai, server):
    llm = chat_model(langchain_openai, server, max_tokens=48, use_responses_api=True)
    out = llm.with_structured_output(Verdict, method="function_calling", include_raw=True).invoke("A verdict")
    assert out["parsing_error"] is None and isinstance(out["parsed"], Verdict)
    (call,) = out["raw"].tool_calls
    assert call["name"] == "Verdict" and Verdict(**call["args"]) == out["parsed"]


def test_langchain_bind_tools_with_a_required_call(langchain_openai, server):
    """bind_tools(tool_choice="any") (OpenAI's "required"): the answer is calls of the bound tools."""

    def lookup(ok: bool) -> str:
        """Look something up."""
        return ""

    llm = chat_model(langchain_openai, server, max_tokens=88, temperature=1.0, seed=3).bind_tools(
        [lookup, Verdict], tool_choice="any")
    msg = llm.invoke("Look up or verdict")
    assert msg.tool_calls and msg.response_metadata["finish_reason"] == "tool_calls"
    for call in msg.tool_calls:
        if call["name"] == "lookup":
            assert isinstance(call["args"]["ok"], bool)
        else:
            assert call["name"] == "Verdict" and isinstance(Verdict(**call["args"]), Verdict)


def test_langchain_completions_llm(langchain_openai, server, completion_want):
    ids, want = completion_want
    llm = langchain_openai.OpenAI(base_url=server.url + "/v1", api_key="x", model=MODEL, temperature=0,
                                  max_tokens=MAX_TOKENS, max_retries=0, timeout=120)
    assert llm.invoke(PROMPT) == want.text
    assert "".join(llm.stream(PROMPT)) == want.text
    result = llm.generate([PROMPT, PROMPT])
    assert [g[0].text for g in result.generations] == [want.text, want.text]
    prompt, completion = 2 * len(ids), 2 * len(want.token_ids)
    assert result.llm_output["token_usage"] == {"prompt_tokens": prompt, "completion_tokens": completion,
                                                "total_tokens": prompt + completion}


# --- LiteLLM ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_openai_agents_sdk_calls_a_function_tool(server, api):
    """An Agents SDK agent whose model must call its tool (tool_choice "required"), stopping at the
    tool's result: the call reaches the Python function with arguments of its signature."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls = []

    @agents.function_tool
    def get_time(zone: Literal["utc", "cet"]) -> str:
        """The time in a zone."""
        calls.append(zone)
        return f"noon {zone}"

    async def run():
        # The client closes on the loop it ran on (left to the garbage collector, it would log an
        # error on a closed loop in whichever later test collects it).
        async with AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0) as client:
            model = (agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel)(
                model=MODEL, openai_client=client)
            agent = agents.Agent(name="clock", instructions="Tell the time.", tools=[get_time], model=model,
                                 tool_use_behavior="stop_on_first_tool",
                                 model_settings=agents.ModelSettings(tool_choice="required", max_tokens=60,
                                                                     temperature=0))
            return await agents.Runner.run(agent, "What time is it?", max_turns=2)

    result = asyncio.run(run())
    assert len(calls) >= 1 and calls[0] in ("utc", "cet") and result.final_output == f"noon {calls[0]}"


@pytest.fixture(scope="module")
def litellm():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # its bundled price list, not a download
        yield pytest.importorskip("litellm")


def litellm_kw(server) -> dict:
    return dict(model=f"openai/{MODEL}", api_base=server.url + "/v1", api_key="x", max_tokens=MAX_TOKENS,
                temperature=0, timeout=120)


def test_litellm_completion(litellm, server, chat_want):
    ids, want = chat_want
    resp = litellm.completion(messages=[{"role": "user", "content": QUESTION}], **litellm_kw(server))
    assert resp.choices[0].message.content == want.text
    assert resp.choices[0].finish_reason == want.finish_reason
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (len(ids), len(want.token_ids))


def test_litellm_completion_stream(litellm, server, chat_want):
    ids, want = chat_want
    chunks = list(litellm.completion(messages=[{"role": "user", "content": QUESTION}], stream=True,
                                     stream_options={"include_usage": True}, **litellm_kw(server)))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    whole = litellm.stream_chunk_builder(chunks)
    assert whole.choices[0].message.content == want.text
    assert whole.choices[0].finish_reason == want.finish_reason
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (len(ids), len(want.token_ids))


def test_litellm_text_completion(litellm, server, completion_want):
    ids, want = completion_want
    resp = litellm.text_completion(prompt=PROMPT, **litellm_kw(server))
    assert resp.choices[0].text == want.text and resp.choices[0].finish_reason == want.finish_reason
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (len(ids), len(want.token_ids))
    chunks = list(litellm.text_completion(prompt=PROMPT, stream=True, **litellm_kw(server)))
    assert "".join(c.choices[0].text or "" for c in chunks) == want.text


# --- benchmark CLIs --------------------------------------------------------------------------------

def cli(name: str) -> str:
    """The CLI's path (on PATH or next to this Python); skips the test when it is not installed."""
    path = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[clients]')")
    return path


@pytest.fixture
def guidellm():
    return cli("guidellm")


@pytest.fixture
def aiperf():
    return cli("aiperf")


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    """The served ouro-tiny as a checkpoint directory with its tokenizer (the CLIs load it with
    AutoTokenizer, which wants the model's config.json too), for synthetic prompts and token counts."""
    from rlt_runtime.models.checkpoint import save_checkpoint
    from rlt_runtime.models.presets import preset_config, preset_weights
    from rlt_runtime.models.tokenizer import builtin_tokenizer

    cfg = preset_config(MODEL)
    path = tmp_path_factory.mktemp("ouro-tiny")
    save_checkpoint(str(path), cfg, preset_weights(cfg, seed=0), tokenizer=builtin_tokenizer(cfg))
    return path


def run_cli(args: list, cwd: Path) -> None:
    env = dict(os.environ, NO_COLOR="1")
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


@pytest.mark.slow
def test_guidellm_benchmark(guidellm, server, tokenizer_dir, tmp_path):
    report = tmp_path / "guidellm.json"
    run_cli([guidellm, "run", "--backend", f"kind=openai_http,target={server.url},model={MODEL}",
             "--profile", "kind=synchronous", "--constraint", f"kind=max_requests,count={REQUESTS}",
             "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir}",
             "--data", f"kind=synthetic_text,prompt_tokens=16,output_tokens={MAX_TOKENS}",
             "--output", f"kind=json,path={report}", "--disable-console"], tmp_path)
    (bench,) = json.loads(report.read_text())["benchmarks"]
    assert bench["metrics"]["request_totals"] == {"successful": REQUESTS, "errored": 0, "incomplete": 0,
                                                  "total": REQUESTS}
    done = bench["requests"]["successful"]
    assert len(done) == REQUESTS and not bench["requests"]["errored"] and not bench["requests"]["incomplete"]
    for request in done:  # ignore_eos: every answer is the requested length; usage is the server's count
        body = json.loads(request["request_args"])["body"]
        assert request["output_metrics"]["text_tokens"] == MAX_TOKENS and request["output"]
        assert request["input_metrics"]["text_tokens"] == len(chat_ids(server, body["messages"]))


@pytest.mark.slow
def test_aiperf_profile(aiperf, server, tokenizer_dir, tmp_path):
    out = tmp_path / "artifacts"
    run_cli([aiperf, "profile", "--model", MODEL, "--url", server.url, "--endpoint-type", "chat",
             "--streaming", "--tokenizer", tokenizer_dir, "--synthetic-input-tokens-mean", "16",
             "--synthetic-input-tokens-stddev", "0", "--output-tokens-mean", MAX_TOKENS,
             "--output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
             "--per-chunk-usage", "--request-count", REQUESTS, "--concurrency", "1", "--artifact-dir", out,
             "--ui-type", "none"], tmp_path)
    report = json.loads((out / "profile_export_aiperf.json").read_text())
    assert report["is_complete"] and not report["was_cancelled"]
    assert report["request_count"]["avg"] == REQUESTS == report["completed_request_count"]["avg"]
    assert report["error_summary"] == [] and report["request_error_rate"]["avg"] == 0
    osl = report["output_sequence_length"]  # the server's usage (--use-server-token-count)
    assert osl["count"] == REQUESTS and osl["min"] == osl["max"] == MAX_TOKENS
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    assert len(records) == REQUESTS and all(r["metrics"]["usage_completion_tokens"]["value"] == MAX_TOKENS
                                            for r in records)
