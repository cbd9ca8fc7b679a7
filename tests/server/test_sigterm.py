"""SIGTERM to a real `rlt-serve` process with a stream in flight: the stream either finishes within
--shutdown-timeout or ends with the documented error event and [DONE]; new connections are
refused; the process exits 0 with no traceback or error in its log."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("uvicorn")

MODEL = "ouro-tiny"


def _start(start_process, tmp_path: Path, shutdown_timeout: float) -> tuple[subprocess.Popen, str, Path]:
    log = tmp_path / "serve.log"
    proc, url = start_process(log, "--max-model-len", "1100", "--shutdown-timeout", str(shutdown_timeout))
    return proc, url, log


def _stream_then_sigterm(proc: subprocess.Popen, url: str, max_tokens: int,
                         after_sigterm=lambda: None) -> tuple[list[str], float]:
    """Stream a completion, send SIGTERM after its first token and call `after_sigterm()`;
    (every data event, SIGTERM time)."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    events, sent_at = [], None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line)
            if sent_at is None:
                proc.send_signal(signal.SIGTERM)
                sent_at = time.monotonic()
                after_sigterm()
    return events, sent_at


def _assert_clean_exit(proc: subprocess.Popen, log: Path, sent_at: float, within: float) -> None:
    code = proc.wait(within + 30)
    text = log.read_text()
    assert code == 0, text
    assert time.monotonic() - sent_at < within, text
    assert "Traceback" not in text and " ERROR " not in text, text


def test_sigterm_cuts_a_long_stream_with_the_error_event(start_process, tmp_path):
    proc, url, log = _start(start_process, tmp_path, shutdown_timeout=1.0)
    refused = []

    def probe() -> None:  # during the grace period: the stream runs, new connections are refused
        time.sleep(0.5)
        try:
            httpx.get(url + "/health", timeout=2)
        except httpx.ConnectError:
            refused.append(True)

    try:
        events, sent_at = _stream_then_sigterm(proc, url, max_tokens=1000, after_sigterm=probe)  # >> 1 s of decoding
        cut_after = time.monotonic() - sent_at
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    assert events[-1] == "data: [DONE]", events[-3:]
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "shutting_down", error
    assert not any('"finish_reason":"length"' in e for e in events)  # cut short, not finished
    assert 1.0 <= cut_after < 1.0 + 5.0
    assert refused == [True]
    _assert_clean_exit(proc, log, sent_at, within=10.0)


def test_sigterm_lets_a_stream_finish_within_the_grace_period(start_process, tmp_path):
    proc, url, log = _start(start_process, tmp_path, shutdown_timeout=60.0)
    events = []
    try:
        events, sent_at = _stream_then_sigterm(proc, url, max_tokens=6)
    finally:
        if proc.poll() is None and not events:
            proc.kill()
    assert events[-1] == "data: [DONE]" and '"finish_reason":"length"' in events[-2], events[-3:]
    assert not any('"error"' in e for e in events)
    _assert_clean_exit(proc, log, sent_at, within=30.0)  # exits once the stream is done, not after 60 s
