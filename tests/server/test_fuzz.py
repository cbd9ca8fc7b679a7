"""Schemathesis against the server's own OpenAPI schema: generated valid and invalid requests for
every operation must never get a 5xx, and the server must stay healthy with its KV pool intact."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

EXAMPLES = {"positive": 50, "negative": 30}


@pytest.fixture(scope="module")
def fuzz_server(start_server):
    # A short context bounds every generated request to a few dozen tokens on the CPU engine.
    with start_server(engine_options={"max_model_len": 32, "max_num_seqs": 32}, request_timeout=120) as live:
        yield live


def _operations(url: str) -> list:
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", sorted(EXAMPLES))
def test_generated_requests_never_get_5xx(fuzz_server, mode):
    operations = _operations(fuzz_server.url)
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /v1/completions", "POST /v1/chat/completions", "POST /tokenize", "POST /detokenize", "GET /v1/models"}
    failures = []
    for op in operations:
        if mode == "negative" and not len(op.body):
            continue  # only request bodies have something to make invalid (the one path parameter is any string)
        strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

        @settings(max_examples=EXAMPLES[mode], deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def check(case):
            if mode == "positive" and isinstance(case.body, dict) and "model" in case.body:
                case.body["model"] = "ouro-tiny"  # reach the engine (unknown models are tested elsewhere)
            resp = case.call(base_url=fuzz_server.url, timeout=120)
            if resp.status_code >= 500:
                failures.append(f"{op.method.upper()} {op.path} -> {resp.status_code}: {resp.text[:300]} "
                                f"body={getattr(case, 'body', None)!r:.300}")

        check()
    assert not failures, "\n".join(failures[:10])
    fuzz_server.wait_idle()
    assert fuzz_server.kv_full()
    assert fuzz_server.worker.ready
