"""vLLM's `vllm serve` flags users type by habit, on a real rlt-serve process: HTTPS
(--ssl-keyfile/--ssl-certfile), --enable-log-requests with --max-log-len, --allowed-origins (CORS),
--uvicorn-log-level, --root-path, and the ones that change nothing here (--disable-log-requests,
--disable-fastapi-docs, --disable-frontend-multiprocessing), --enable-request-id-headers, --uds (a
Unix domain socket); half of an HTTPS pair is refused."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time

import httpx
import pytest

from conftest import MODEL, REPO

def _certificate(tmp_path) -> tuple[str, str]:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return str(key), str(cert)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_request_logs_cors_and_quiet_flags(start_process, tmp_path):
    key, cert = _certificate(tmp_path)
    log = tmp_path / "serve.log"
    proc, url = start_process(log, "--ssl-keyfile", key, "--ssl-certfile", cert, "--enable-log-requests",
                              "--max-log-len", "7", "--allowed-origins", "https://app.example",
                              "--uvicorn-log-level", "warning", "--root-path", "/llm", "--disable-fastapi-docs",
                              "--disable-frontend-multiprocessing", https_ca=cert)
    try:
        assert url.startswith("https://")
        body = dict(model=MODEL, prompt="Hello there, a logged prompt", max_tokens=2)
        resp = httpx.post(url + "/v1/completions", json=body, verify=cert, timeout=60,
                          headers={"Origin": "https://app.example"})
        assert resp.status_code == 200
        assert resp.headers["access-control-allow-origin"] == "https://app.example"
        with pytest.raises(httpx.TransportError):  # plain HTTP does not reach an HTTPS server
            httpx.get(url.replace("https", "http") + "/health", timeout=5)
    finally:
        proc.terminate()
        proc.wait(30)
    text = log.read_text()
    assert "prompt 'Hello t', " in text and "SamplingParams(" in text  # clipped to 7 characters
    assert "Application startup complete" not in text  # (uvicorn's info lines are below warning)


def test_half_an_https_pair_and_log_flag_conflicts_are_refused(tmp_path):
    cmd = [sys.executable, "-m", "rlt_runtime.entrypoints.server.cli", "--model", MODEL, "--device", "cpu"]
    out = subprocess.run(cmd + ["--ssl-keyfile", "k.pem"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--ssl-keyfile and --ssl-certfile go together" in out.stderr
    out = subprocess.run(cmd + ["--enable-log-requests", "--disable-log-requests"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "not allowed with argument" in out.stderr
    out = subprocess.run(cmd + ["--max-log-len", "-1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "max_log_len must be a non-negative integer" in out.stderr


def test_request_id_headers(start_server):
    """--enable-request-id-headers: every answer carries X-Request-Id, the request's own or a new
    one, refusals too (a 401 behind the API key); off, none."""
    with start_server(request_id_headers=True, api_key="k") as live:
        auth = {"Authorization": "Bearer k"}
        own = httpx.post(live.url + "/v1/completions", json=dict(prompt="Hi", max_tokens=1), timeout=60,
                         headers=dict(auth, **{"X-Request-Id": "trace-42"}))
        assert own.status_code == 200 and own.headers["x-request-id"] == "trace-42"
        new = httpx.get(live.url + "/v1/models", headers=auth, timeout=60).headers["x-request-id"]
        refused = httpx.get(live.url + "/v1/models", timeout=60)
        assert refused.status_code == 401
        assert re.fullmatch("[0-9a-f]{32}", new) and re.fullmatch("[0-9a-f]{32}", refused.headers["x-request-id"])
        assert new != refused.headers["x-request-id"]  # (a new one for each request)
    with start_server() as live:
        assert "x-request-id" not in httpx.get(live.url + "/v1/models", timeout=60).headers


def test_unix_domain_socket(tmp_path):
    """--uds: the server listens on a Unix socket file instead of a TCP port, and answers there."""
    path = tmp_path / "rlt.sock"
    log = tmp_path / "serve.log"
    proc = subprocess.Popen([sys.executable, "-m", "rlt_runtime.entrypoints.server.cli", "--model", MODEL, "--device",
                             "cpu", "--dtype", "float32", "--num-blocks", "64", "--uds", str(path)], cwd=REPO,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(path)), base_url="http://rlt", timeout=5) as client:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log.read_text()
                try:
                    if client.get("/health").status_code == 200:
                        break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.2)
            out = client.post("/v1/completions", json=dict(prompt="Hi", max_tokens=2), timeout=60)
            assert out.status_code == 200 and out.json()["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        proc.wait(30)
