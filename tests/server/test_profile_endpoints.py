"""vLLM's profiling endpoints (what `vllm bench serve --profile` calls): POST /start_profile, then
requests, then POST /stop_profile writes a torch.profiler trace into --profile-dir and names it;
without --profile-dir, or out of order, they are 400s; both sit behind the API key."""

from __future__ import annotations

import json

import httpx

from conftest import MODEL


def test_start_and_stop_profile_write_a_trace(start_server, tmp_path):
    with start_server(engine_options={"profile_dir": str(tmp_path), "profile_steps": (0, 0)}) as live:
        assert httpx.post(live.url + "/stop_profile", timeout=60).status_code == 400  # none recording
        assert httpx.post(live.url + "/start_profile", timeout=60).json() == {"profiling": True}
        assert httpx.post(live.url + "/start_profile", timeout=60).status_code == 400  # already recording
        body = dict(model=MODEL, prompt="profile me", max_tokens=4)
        assert httpx.post(live.url + "/v1/completions", json=body, timeout=60).status_code == 200
        stopped = httpx.post(live.url + "/stop_profile", timeout=60).json()
        assert stopped["profiling"] is False and len(stopped["traces"]) == 1
        assert stopped["traces"][0].startswith(str(tmp_path))
        assert json.loads(open(stopped["traces"][0]).read())["traceEvents"]


def test_without_a_profile_dir_and_behind_the_key(server, start_server):
    resp = httpx.post(server.url + "/start_profile", timeout=60)
    assert resp.status_code == 400 and "profile_dir" in resp.json()["error"]["message"]
    with start_server(api_key="secret") as live:
        for path in ("/start_profile", "/stop_profile"):
            assert httpx.post(live.url + path, timeout=60).status_code == 401
