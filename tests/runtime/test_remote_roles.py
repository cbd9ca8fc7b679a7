"""Disaggregated prefill with its engines started apart (`rlt-serve --role`, engine/remote_role.py),
on CPU processes over gloo: the front end's outputs are bit for bit one engine's, bad keys and
unreachable or mismatched engines give clear errors, and the engines end with their front end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.config import EngineConfig
from rlt_runtime.engine.remote_role import ROLE_KEY_ENV, connect_role, role_key
from rlt_runtime.errors import ConfigError

KEY = "test-role-key"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(role: str, port: int, kv_port: int, *extra: str, key: str = KEY) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rlt_runtime.entrypoints.server.cli", "--model", "ouro-tiny", "--device", "cpu",
           "--role", role, "--role-address", f"127.0.0.1:{port}", "--kv-transfer-address", f"127.0.0.1:{kv_port}",
           *extra]
    return subprocess.Popen(cmd, env=dict(os.environ, **{ROLE_KEY_ENV: key}), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _listening(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}")


@pytest.fixture
def roles(monkeypatch):
    """Start a prefill and a decode engine apart (extra flags per role); returns their addresses."""
    monkeypatch.setenv(ROLE_KEY_ENV, KEY)
    procs = []

    def start(prefill_flags=(), decode_flags=()):
        ports = {"prefill": _port(), "decode": _port()}
        kv_port = _port()
        for role, flags in (("prefill", prefill_flags), ("decode", decode_flags)):
            procs.append(_start(role, ports[role], kv_port, *flags))
        for role, proc in zip(ports, procs[-2:]):
            _listening(ports[role], proc)
        return {role: f"127.0.0.1:{port}" for role, port in ports.items()}, procs[-2:]

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _front_end(addresses: dict, **kw) -> LLM:
    return LLM("ouro-tiny", device="cpu", disaggregated_prefill=True, prefill_address=addresses["prefill"],
               decode_address=addresses["decode"], **kw)


def test_engines_started_apart_match_one_engine(roles):
    """Greedy and seeded sampled requests through engines started apart: the tokens, log-probs and
    exit depths of one engine, every request handed off; both engines end with their front end."""
    addresses, procs = roles()
    llm = _front_end(addresses)
    prompts = ["Hello world", "The loop runs", "abc def ghi jkl", "x"]
    params = [SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=9, temperature=0.8, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)]
    got = llm.generate(prompts, params)
    handoffs = llm.engine.num_handoffs
    llm.engine.shutdown()
    for proc in procs:
        assert proc.wait(60) == 0, proc.stdout.read()
    want = LLM("ouro-tiny", device="cpu").generate(prompts, params)
    for g, w in zip(got, want):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        assert g.outputs[0].exit_depths == w.outputs[0].exit_depths
        assert g.outputs[0].logprobs == w.outputs[0].logprobs
    assert handoffs == 3  # the max_tokens=1 request finishes on the prefill engine


def test_mismatched_engines_are_refused(roles):
    """Engines started with different depths cannot serve one front end: a ConfigError naming what differs."""
    addresses, _ = roles(prefill_flags=("--num-loops", "3"))
    with pytest.raises(ConfigError, match="differ in depth"):
        _front_end(addresses)


def test_wrong_key_and_unreachable_engine(roles, monkeypatch):
    """A front end with another key is refused (the engine keeps waiting for the right one); an
    address nothing listens on names the address and how to start the engine there."""
    addresses, procs = roles()
    monkeypatch.setenv(ROLE_KEY_ENV, "another key")
    with pytest.raises(ConfigError, match=f"cannot reach the prefill engine at {addresses['prefill']}"):
        connect_role("prefill", addresses["prefill"])
    monkeypatch.setenv(ROLE_KEY_ENV, KEY)
    assert procs[0].poll() is None  # still waiting for its front end
    llm = _front_end(addresses)
    assert [o.outputs[0].token_ids for o in llm.generate(["Hi"], SamplingParams(max_tokens=3, temperature=0))]
    llm.engine.shutdown()
    with pytest.raises(ConfigError, match="rlt-serve --role decode --role-address 127.0.0.1:"):
        connect_role("decode", f"127.0.0.1:{_port()}")


def test_role_options_are_checked(monkeypatch):
    monkeypatch.delenv(ROLE_KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match=ROLE_KEY_ENV):
        role_key()
    cases = [
        (dict(role="prefill"), "needs role_address"),
        (dict(role="both", role_address="h:1", kv_transfer_address="h:2"), "role must be one of"),
        (dict(role_address="h:1"), "set role or leave them None"),
        (dict(role="decode", role_address="h", kv_transfer_address="h:2"), "role_address must be 'HOST:PORT'"),
        (dict(role="decode", role_address="h:1", kv_transfer_address="h:2", disaggregated_prefill=True),
         "cannot be combined"),
        (dict(disaggregated_prefill=True, prefill_address="h:1"), "set both or neither"),
        (dict(prefill_address="h:1", decode_address="h:2"), "for disaggregated_prefill=True"),
        (dict(disaggregated_prefill=True, prefill_address="h:1", decode_address="h:99999"), "decode_address must be"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            EngineConfig.from_kwargs(**kwargs).validate_static()
    with pytest.raises(ConfigError, match="run it with rlt-serve --role"):
        LLM("ouro-tiny", device="cpu", role="prefill", role_address="127.0.0.1:1", kv_transfer_address="127.0.0.1:2")
