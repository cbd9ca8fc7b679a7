"""Live rlt servers on loopback for the server tests (rlt-serve's uvicorn server on a background thread, port 0)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

import uvicorn  # noqa: E402

from rlt_runtime.engine.llm_engine import LLMEngine  # noqa: E402
from rlt_runtime.entrypoints.server import EngineWorker, ServerConfig, create_app  # noqa: E402
from rlt_runtime.entrypoints.server.http_server import build_server  # noqa: E402

MODEL = "ouro-tiny"
REPO = Path(__file__).resolve().parents[2]
ENGINE_DEFAULTS = dict(dtype="float32", device="cpu", max_num_seqs=16, num_blocks=512, max_model_len=128)


class LiveServer:
    """A running server: `url` (no trailing slash), its `worker` and `engine`."""

    def __init__(self, url: str, worker: EngineWorker, server: uvicorn.Server, thread: threading.Thread):
        self.url, self.worker, self.server, self.thread = url, worker, server, thread

    @property
    def engine(self) -> LLMEngine:
        return self.worker.engine

    def on_engine(self, fn, timeout: float = 30.0):
        """Run fn(engine) on the engine thread and return its result."""
        return self.worker.call(fn).result(timeout)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no request runs, and the engine holds no unfinished work."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.worker.num_active == 0 and not self.on_engine(lambda e: e.has_unfinished_requests()):
                return
            time.sleep(0.02)
        raise AssertionError(f"server still busy after {timeout} s: {self.worker.num_active} active requests")

    def kv_full(self) -> bool:
        """Every KV block is free (or an idle prefix-cache block) and the bookkeeping is consistent."""
        def check(engine):
            engine.check_invariants()
            return engine.kv.pool.num_free == engine.kv.pool.num_blocks
        return self.on_engine(check)

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the server did not stop"


@contextlib.contextmanager
def live_server(engine_options: Optional[dict] = None, engine_factory: Optional[Callable[[], LLMEngine]] = None,
                **config):
    """Start an ouro-tiny server and yield a LiveServer; stop it afterwards.

    With `engine_factory` the engine is built on the worker thread and the server is yielded as
    soon as HTTP is up (possibly before the engine is ready).
    """
    if engine_factory is None:
        engine = LLMEngine(MODEL, **dict(ENGINE_DEFAULTS, **(engine_options or {})))
        worker = EngineWorker(engine)
    else:
        worker = EngineWorker(engine_factory)
    config.setdefault("served_model_name", MODEL)
    app = create_app(worker, ServerConfig(**config))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = build_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (server.started and (worker.ready or engine_factory is not None)):
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    live = LiveServer(f"http://127.0.0.1:{port}", worker, server, thread)
    try:
        yield live
    finally:
        if thread.is_alive():
            live.stop()
        sock.close()


@pytest.fixture(scope="session")
def start_server():
    """`live_server` as a fixture, for modules that need servers with their own limits."""
    return live_server


def serve_process(log: Path, *flags: str, preexec_fn=None, https_ca: Optional[str] = None) -> tuple[subprocess.Popen, str]:
    """Start `rlt-serve --model ouro-tiny` (CPU, fp32) on a free port with `flags`, output to `log`;
    return (the process, its url) once /health answers 200 (over HTTPS, trusting `https_ca`, when given)."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rlt_runtime.entrypoints.server.cli", "--model", MODEL, "--port", str(port),
         "--dtype", "float32", "--device", "cpu", "--num-blocks", "256", *flags],
        cwd=REPO, stdout=log.open("w"), stderr=subprocess.STDOUT, preexec_fn=preexec_fn)
    url = f"{'https' if https_ca else 'http'}://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=2, verify=https_ca or True).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("rlt-serve did not become healthy")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def start_process():
    """`serve_process` as a fixture: a real rlt-serve process."""
    return serve_process


@pytest.fixture(scope="module")
def server():
    """One shared server per test module (default limits)."""
    with live_server() as live:
        yield live


# Offline engines built like the shared server's (fp32 on the CPU), for comparing HTTP with LLM.
OFFLINE = dict(dtype="float32", device="cpu", max_num_seqs=4, num_blocks=256, max_model_len=128)


@pytest.fixture(scope="module")
def client(server):
    """The official openai client pointed at the shared server."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def offline():
    """An offline LLM of the shared server's model and settings."""
    from rlt_runtime import LLM

    return LLM(MODEL, **OFFLINE)


@pytest.fixture
def submitted_params(server, monkeypatch) -> list:
    """The SamplingParams of every submission the shared server's worker receives in the test."""
    seen = []
    submit = server.worker.submit

    def spy(prompts, params, arrival_time):
        seen.append(params)
        return submit(prompts, params, arrival_time)

    monkeypatch.setattr(server.worker, "submit", spy)
    return seen
