"""The conformance harness (perf/conformance.py) itself: real eager cases pass through the real
runner, one process each, and a planted mismatch, crash or hang makes the run fail."""

from __future__ import annotations

import json

import pytest

from perf.conformance import classify, complete, matrix, run_matrix
from rlt_runtime import LLM, ConfigError

OURO = dict(model="ouro-tiny", sampling="mixed", logprobs=2, n=2, requests=3, max_tokens=4, tiny_pool=2,
            prefill_chunk_size=3, async_scheduling=True, exit_thresholds=[1.0, 0.6], workload_seed=5)
HUGINN = dict(model="huginn-tiny", kv_layout="last_exited", last_exited_reads="copy", exit_mode="latent-diff",
              exit_criterion_threshold=1.2, exit_thresholds=[], requests=2, max_tokens=4, workload_seed=3)


def test_runner_passes_real_cases_and_fails_on_planted_faults(tmp_path):
    cases = [
        complete(0, OURO),
        complete(1, HUGINN),
        complete(2, {**OURO, "requests": 1, "n": 1, "tiny_pool": 0, "plant": "flip-token"}),
        complete(3, {"plant": "abort"}),
        complete(4, {"plant": "hang", "time_limit_s": 3}),
    ]
    code = run_matrix(cases, tmp_path, workers=2, budget_s=400)
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "conformance.jsonl").read_text().splitlines())}
    assert sorted(rows) == ["c000", "c001", "c002", "c003", "c004"]
    ouro, huginn, flipped, aborted, hung = (rows[f"c00{i}"] for i in range(5))
    assert ouro["status"] == "pass", ouro
    assert ouro["stats"]["preemptions"] > 0  # the tiny pool did preempt
    assert huginn["status"] == "pass", huginn
    assert "2 greedy requests vs the fp64 dense reference" in huginn["checks"]
    assert flipped["status"] == "fail" and flipped["detail"].startswith("r0 vs alone") and "token_ids[" in flipped["detail"]
    assert aborted["status"] == "crash" and aborted["exit_code"] == -6
    assert hung["status"] == "timeout"
    assert code == 1
    table = (tmp_path / "conformance.md").read_text()
    assert "pass: 2" in table and "fail: 1" in table and "crash: 1" in table and "timeout: 1" in table


def _config_error(model: str, **options) -> dict:
    """A child's result for an engine that refused these options (the real engine's message)."""
    with pytest.raises(ConfigError) as err:
        LLM(model, device="cpu", **options)
    return {"status": "config-error", "detail": str(err.value), "checks": [], "stats": {}}


def test_only_expected_config_errors_are_not_applicable():
    graphs_on_cpu = complete(0, {"execution_mode": "graphs"})
    assert classify(graphs_on_cpu, _config_error("ouro-tiny", execution_mode="graphs"))["status"] == "not-applicable"
    odd_layout = _config_error("huginn-tiny", kv_layout="compress-s3")
    assert classify(complete(1, {"model": "huginn-tiny", "kv_layout": "compress-s3"}), odd_layout)["status"] == "fail"
    # An expected combination refused for a different reason is still a failure.
    assert classify(graphs_on_cpu, odd_layout)["status"] == "fail"


def test_matrix_is_deterministic_and_covers_sampled_speculation_everywhere():
    cases = matrix(60, 7, "cuda")
    assert cases == matrix(60, 7, "cuda") and cases != matrix(60, 8, "cuda")
    assert matrix(6, 7, "cuda") == cases[:6]  # case i does not depend on --cases
    assert all(c["execution_mode"] == "eager" for c in matrix(30, 7, "cpu"))
    assert [c["id"] for c in cases if c["execution_mode"] == "compile"] == ["c005", "c025", "c045"]
    # Draft counts are per request, so sampled speculation is drawn with every policy, async and
    # tiny pools alike (the matrix must not fence it off again).
    sampled_spec = [c for c in cases if c["speculative_config"] and c["sampling"] != "greedy"]
    assert {c["speculative_config"]["draft_policy"] for c in sampled_spec} == {"fixed", "adaptive"}
    assert any(c["async_scheduling"] for c in sampled_spec) and any(c["tiny_pool"] for c in sampled_spec)