"""The official `openai` client against a live rlt server on loopback (ouro-tiny, fp32, CPU)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")
from openai.types import Completion  # noqa: E402
from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: E402

MODEL = "ouro-tiny"
REPO = Path(__file__).resolve().parents[2]


def _metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


def _prompt_len(server, text: str) -> int:
    return httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["count"]


def _validate_completion_chunk(chunk) -> None:
    """Validate a streamed completion against the client's Completion type. The type marks
    finish_reason as required, but streams (OpenAI's too) send null until the last chunk."""
    data = chunk.model_dump()
    for choice in data["choices"]:
        assert choice["finish_reason"] in (None, "stop", "length")
        choice["finish_reason"] = choice["finish_reason"] or "length"
    Completion.model_validate(data)


def test_completion_validates_and_counts(client, server):
    resp = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=5, temperature=0,
                                     extra_body={"ignore_eos": True})
    Completion.model_validate(resp.model_dump())
    assert resp.object == "text_completion" and resp.model == MODEL
    assert len(resp.choices) == 1 and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 5
    assert resp.usage.prompt_tokens == _prompt_len(server, "Hello there")
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 5


def test_usage_reports_the_prompt_tokens_the_prefix_cache_served(client):
    """usage.prompt_tokens_details.cached_tokens: 0 for a new prompt, the shared prefix's whole
    blocks (16 tokens each) for a prompt that repeats it, in plain and streamed responses."""
    head = list(range(40, 80))  # 40 tokens: two whole blocks
    kw = dict(model=MODEL, max_tokens=2, temperature=0, extra_body={"ignore_eos": True})
    first = client.completions.create(prompt=head + [7], **kw)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = client.completions.create(prompt=head + [9, 9], **kw)
    assert again.usage.prompt_tokens_details.cached_tokens == 32 and again.usage.prompt_tokens == 42
    chunks = list(client.completions.create(prompt=head + [5], stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 32


def test_token_prompts_and_n(client):
    resp = client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], n=2, max_tokens=3, seed=3,
                                     extra_body={"ignore_eos": True})
    Completion.model_validate(resp.model_dump())
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert resp.usage.prompt_tokens == 5 and resp.usage.completion_tokens == 12
    chunks = list(client.completions.create(model=MODEL, prompt=[[5, 6, 7], [8, 9]], n=2, max_tokens=3, seed=3,
                                            stream=True, extra_body={"ignore_eos": True}))
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(4)}
    assert texts == {c.index: c.text for c in resp.choices}  # same seed: same samples, streamed per choice
    assert sorted(c.choices[0].index for c in chunks if c.choices[0].finish_reason) == [0, 1, 2, 3]


def test_echo_prepends_the_prompt(client):
    kw = dict(model=MODEL, prompt="Echo me", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(**kw).choices[0].text
    echoed = client.completions.create(echo=True, **kw).choices[0].text
    assert echoed == "Echo me" + plain
    streamed = "".join(c.choices[0].text for c in client.completions.create(echo=True, stream=True, **kw))
    assert streamed == echoed


def test_seed_reproducible_and_streaming_matches(client):
    kw = dict(model=MODEL, prompt="Once upon", max_tokens=8, temperature=0.9, seed=1234, extra_body={"ignore_eos": True})
    a = client.completions.create(**kw).choices[0].text
    b = client.completions.create(**kw).choices[0].text
    other = client.completions.create(**dict(kw, seed=99)).choices[0].text
    assert a == b
    assert a != other
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    for chunk in chunks:
        _validate_completion_chunk(chunk)
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 8
    assert "".join(c.choices[0].text for c in chunks[:-1]) == a
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"


def test_stop_string_cuts_text(client):
    kw = dict(model=MODEL, prompt=[40, 41, 42], max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    visible = [ch for ch in full[1:] if ch.isprintable() and ch != "\ufffd"]
    assert visible, f"greedy text has no printable character to stop on: {full!r}"
    stop = visible[0]
    expected = full[:full.index(stop)]
    resp = client.completions.create(stop=[stop, "never-matches"], **kw)
    assert resp.choices[0].text == expected and resp.choices[0].finish_reason == "stop"
    streamed = list(client.completions.create(stop=stop, stream=True, **kw))
    assert "".join(c.choices[0].text for c in streamed) == expected
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_streamed_deltas_add_up_to_the_whole_response(client, server):
    """n = 2 sampled choices (random bytes: multi-byte characters split over steps) with logprobs,
    prompt_logprobs and exit depths: each choice's streamed chunks concatenate to the non-streamed
    choice (text, tokens, log-probabilities, offsets, depths), no chunk carries a character the
    whole text does not have there, and the server's token counter grows by exactly the tokens."""
    kw = dict(model=MODEL, prompt="Stream me", n=2, max_tokens=12, temperature=1.0, seed=21, logprobs=2,
              extra_body={"ignore_eos": True, "prompt_logprobs": 1})
    whole = client.completions.create(**kw)
    before = _metric(server, "vllm:generation_tokens_total")
    chunks = list(client.completions.create(stream=True, **kw))
    assert _metric(server, "vllm:generation_tokens_total") - before == 24
    for choice in whole.choices:
        parts = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == choice.index]
        assert "".join(p.text for p in parts) == choice.text
        got = [(t, v, o) for p in parts if p.logprobs for t, v, o in
               zip(p.logprobs.tokens, p.logprobs.token_logprobs, p.logprobs.text_offset)]
        assert got == list(zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.text_offset))
        depths = [d for p in parts for d in p.model_extra["exit_depths"]]
        assert depths == choice.model_extra["exit_depths"] and len(depths) == 12
        assert [p.model_extra.get("prompt_logprobs") is not None for p in parts][0]
        assert parts[0].model_extra["prompt_logprobs"] == choice.model_extra["prompt_logprobs"]
        assert [p.finish_reason for p in parts][-1] == "length"


def test_completion_logprobs_shape(client):
    resp = client.completions.create(model=MODEL, prompt="abc", max_tokens=4, temperature=0, logprobs=3,
                                     extra_body={"ignore_eos": True})
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 4 and chosen <= 0.0  # keyed by string: byte tokens may share "\ufffd"
        assert chosen == pytest.approx(max(top.values()), abs=1e-5)  # greedy picks the most likely token
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0


def test_max_tokens_null_runs_to_the_context(client, server):
    prompt = list(range(10, 10 + server.engine.max_model_len - 6))
    resp = client.completions.create(model=MODEL, prompt=prompt, max_tokens=None, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 6 and resp.choices[0].finish_reason == "length"


def test_chat_completion_and_stream(client):
    kw = dict(model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}],
              max_completion_tokens=6, temperature=0.7, seed=5, extra_body={"ignore_eos": True})
    resp = client.chat.completions.create(**kw)
    ChatCompletion.model_validate(resp.model_dump())
    assert resp.choices[0].message.role == "assistant" and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    for chunk in chunks:
        ChatCompletionChunk.model_validate(chunk.model_dump())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.role is None for c in chunks[1:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == resp.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"


def test_chat_n_and_logprobs(client):
    parts = [{"type": "text", "text": "x"}]
    resp = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}], n=2,
                                          max_completion_tokens=3, logprobs=True, top_logprobs=2,
                                          extra_body={"ignore_eos": True})
    ChatCompletion.model_validate(resp.model_dump())
    assert [c.index for c in resp.choices] == [0, 1]
    for choice in resp.choices:
        assert len(choice.logprobs.content) == 3
        assert all(len(t.top_logprobs) == 2 for t in choice.logprobs.content)


def test_chat_stops_on_end_of_turn(client, server, submitted_params):
    seen = submitted_params
    msgs = [{"role": "user", "content": "Hi"}]
    client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=1,
                                   extra_body={"stop_token_ids": [7]})
    client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=1, extra_body={"ignore_eos": True})
    im_end = server.engine.tokenizer.chat_stop_token_ids
    assert im_end and seen[0].stop_token_ids == [7, *im_end]
    assert seen[1].stop_token_ids is None  # ignore_eos also ignores the end-of-turn marker
    every_id = list(range(server.engine.model_config.vocab_size))
    stopped = client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, extra_body={"stop_token_ids": every_id})
    assert stopped.choices[0].finish_reason == "stop" and stopped.usage.completion_tokens == 1


def test_unsupported_chat_features_are_clear_400s(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert err.value.body["param"] == "tool_choice"  # "auto", the default with tools: no free-form parser
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    assert err.value.body["param"] == "messages[0].content[0].type"
    assert "image_url" in err.value.body["message"]


def test_models_and_unknown_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)


def test_loop_controls_reach_the_engine(client, server):
    before = _metric(server, 'rlt:loops_per_token_bucket{le="1.0"}')
    client.completions.create(model=MODEL, prompt="loops", max_tokens=4, temperature=0,
                              extra_body={"ignore_eos": True, "max_loops": 1, "speculative": False})
    after = _metric(server, 'rlt:loops_per_token_bucket{le="1.0"}')
    assert after - before == 3  # the first token comes from the full-depth prompt pass


def test_metrics_and_tokenizer_endpoints(client, server):
    client.completions.create(model=MODEL, prompt="m", max_tokens=2)
    assert _metric(server, "vllm:generation_tokens_total") > 0
    assert _metric(server, "vllm:time_to_first_token_seconds_count") > 0
    assert _metric(server, "vllm:e2e_request_latency_seconds_count") > 0
    assert _metric(server, "vllm:num_requests_running") >= 0
    ids = httpx.post(server.url + "/tokenize", json={"prompt": "héllo"}).json()["tokens"]
    assert httpx.post(server.url + "/detokenize", json={"tokens": ids}).json()["prompt"] == "héllo"
    chat = httpx.post(server.url + "/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["count"] == len(chat["tokens"]) > 2
    assert httpx.get(server.url + "/health").status_code == 200
    assert httpx.get(server.url + "/ping").json() == httpx.post(server.url + "/ping").json() == {"status": "ok"}
    from importlib.metadata import version
    assert httpx.get(server.url + "/version").json() == {"version": version("rlt")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, *flags: str) -> subprocess.Popen:
    log = open(tmp_path / "serve.log", "w")
    return subprocess.Popen([sys.executable, "-m", "rlt_runtime.entrypoints.server.cli", "--dtype", "float32",
                             "--device", "cpu", "--num-blocks", "256", "--max-model-len", "128", *flags],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def test_rlt_serve_command_end_to_end(tmp_path):
    port = _free_port()
    proc = _serve(tmp_path, "--model", "ouro-tiny", "--port", str(port), "--served-model-name", "tiny",
                  "--api-key", "k3y")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "rlt-serve did not become healthy"
            time.sleep(0.1)
        cli = openai.OpenAI(base_url=url + "/v1", api_key="k3y", max_retries=0, timeout=60)
        resp = cli.completions.create(model="tiny", prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True})
        assert resp.usage.completion_tokens == 3
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
        assert "access-control-allow-origin" not in httpx.options(url + "/v1/models", headers=preflight).headers
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log
    assert "Traceback" not in log


def test_rlt_serve_exits_when_the_model_fails_to_load(tmp_path):
    proc = _serve(tmp_path, "--model", str(tmp_path / "no-such-checkpoint"), "--port", str(_free_port()))
    assert proc.wait(120) == 1
    assert "the engine failed" in (tmp_path / "serve.log").read_text()


def test_serve_flags_map_to_engine_options():
    from rlt_runtime.entrypoints.engine_args import engine_kwargs as engine_options
    from rlt_runtime.entrypoints.server.cli import build_parser
    from rlt_runtime.errors import ConfigError

    parse = build_parser().parse_args
    args = parse(["--model", "ouro-tiny", "--speculative-tokens", "3", "--draft-loops", "2", "--draft-policy", "fixed",
                  "--max-num-seqs", "8"])
    assert args.host == "127.0.0.1" and args.cors_origins == [] and args.api_key is None
    assert engine_options(args) == {"max_num_seqs": 8, "speculative_config": {
        "num_speculative_tokens": 3, "draft_loops": 2, "draft_policy": "fixed"}}
    assert "speculative_config" not in engine_options(parse(["--model", "m"]))
    with pytest.raises(ConfigError):
        engine_options(parse(["--model", "m", "--speculative-config", '{"num_speculative_tokens": 2}',
                              "--speculative-tokens", "3"]))
    with pytest.raises(ConfigError):
        engine_options(parse(["--model", "m", "--draft-loops", "2"]))


def test_explicit_nulls_mean_defaults(server):
    body = {"model": MODEL, "prompt": "x", "max_tokens": 2, "n": None, "stream": None, "echo": None, "logprobs": None,
            "temperature": None, "stop": None, "seed": None, "ignore_eos": None, "stream_options": None}
    resp = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
    assert resp.status_code == 200, resp.text
    Completion.model_validate(resp.json())
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 2, "n": None,
            "logprobs": None, "top_logprobs": None, "tools": None, "tool_choice": None, "response_format": None}
    resp = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=30)
    assert resp.status_code == 200, resp.text
    ChatCompletion.model_validate(resp.json())


def test_vllm_bench_payloads_are_accepted(server):
    """The request bodies `vllm bench serve` sends (completions and chat) stream with usage."""
    completions = {"model": MODEL, "prompt": "bench", "temperature": 0.0, "repetition_penalty": 1.0, "best_of": 1,
                   "max_tokens": 3, "logprobs": None, "stream": True, "stream_options": {"include_usage": True},
                   "ignore_eos": True}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "bench"}]}],
            "temperature": 0.0, "max_completion_tokens": 3, "stream": True, "stream_options": {"include_usage": True},
            "ignore_eos": True}
    for path, body in (("/v1/completions", completions), ("/v1/chat/completions", chat)):
        with httpx.stream("POST", server.url + path, json=body, timeout=30) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            raw = resp.read().decode()
        events = raw.split("\n\n")
        assert events[-1] == "" and events[-2] == "data: [DONE]"
        usage = json.loads(events[-3][len("data: "):])
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 3
        assert all(e.startswith("data: ") for e in events[:-1])


def test_speculative_server_metrics_and_opt_out(start_server):
    with start_server(engine_options={"speculative_config": {"num_speculative_tokens": 2}}) as live:
        cli = openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        kw = dict(model=MODEL, prompt="Speculate", max_tokens=10, temperature=0)
        spec = cli.completions.create(extra_body={"ignore_eos": True}, **kw).choices[0].text
        plain = cli.completions.create(extra_body={"ignore_eos": True, "speculative": False}, **kw).choices[0].text
        streamed = "".join(c.choices[0].text for c in cli.completions.create(
            stream=True, extra_body={"ignore_eos": True}, **kw))
        assert spec == plain == streamed  # greedy speculation commits exactly the target's tokens
        live.wait_idle()  # the engine thread refreshed its stats snapshot when it went idle
        drafts = _metric(live, "vllm:spec_decode_num_drafts_total")
        drafted = _metric(live, "vllm:spec_decode_num_draft_tokens_total")
        accepted = _metric(live, "vllm:spec_decode_num_accepted_tokens_total")
        first = _metric(live, 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}')
        assert drafts > 0 and drafted >= drafts and 0 <= accepted <= drafted and first <= accepted
        assert _metric(live, 'rlt:spec_decode_num_drafted_tokens_per_pos_total{position="0"}') >= first
