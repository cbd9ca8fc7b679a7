"""The conformance harness (perf/conformance.py) itself: real eager cases pass through the real
runner, one process each, and a planted mismatch, crash or hang makes the run fail; a case slowed
only by the cases beside it passes when it runs again alone."""

from __future__ import annotations

import json

import pytest

from perf.conformance import FEATURES, LATE_FEATURES, classify, complete, matrix, run_matrix
import perf.conformance as conformance
import perf.conformance_case as conformance_case
from perf.conformance_case import (alone_options, budget_problem, build_workload, engine_options, guided_problem,
                                   reference_difference, run_alone, run_crowd)
from rlt_runtime import LLM, ConfigError, GuidedDecoding, SamplingParams
from rlt_runtime.models.presets import preset_config

OURO = dict(model="ouro-tiny", sampling="mixed", logprobs=2, n=2, requests=4, max_tokens=4, tiny_pool=2,
            prefill_chunk_size=3, async_scheduling=True, exit_thresholds=[1.0, 0.6], workload_seed=9,
            features=[*FEATURES, *LATE_FEATURES], kv_cache_dtype="fp8", split_keys=64)
HUGINN = dict(model="huginn-tiny", kv_layout="last_exited", last_exited_reads="copy", exit_mode="latent-diff",
              exit_criterion_threshold=1.2, exit_thresholds=[], requests=2, max_tokens=4, workload_seed=3,
              features=["bias-min-bad", "penalties", "allowed-ids"], new_weights=True, sleep=True)
HANG_LIMIT_S = 15  # the planted hangs: about 3x the 5 s a case takes alone on a CPU (its engine is built at 3 s)


def test_runner_passes_real_cases_and_fails_on_planted_faults(tmp_path):
    cases = [
        complete(0, OURO),
        complete(1, HUGINN),
        complete(2, {**OURO, "requests": 1, "n": 1, "tiny_pool": 0, "plant": "flip-token"}),
        complete(3, {"plant": "abort"}),
        complete(4, {"plant": "hang", "time_limit_s": HANG_LIMIT_S}),
        complete(5, {"plant": "hang-beside-others", "time_limit_s": HANG_LIMIT_S}),
    ]
    code = run_matrix(cases, tmp_path, workers=2, budget_s=400)
    lines = [json.loads(line) for line in (tmp_path / "conformance.jsonl").read_text().splitlines()]
    rows = {r["id"]: r for r in lines}  # a case's last line is its result
    assert sorted(rows) == ["c000", "c001", "c002", "c003", "c004", "c005"]
    ouro, huginn, flipped, aborted, hung, crowded = (rows[f"c00{i}"] for i in range(6))
    assert ouro["status"] == "pass", ouro
    assert ouro["stats"]["preemptions"] > 0  # the tiny pool did preempt
    drawn = next(c for c in ouro["checks"] if c.startswith("requests with features: "))
    assert all(f in drawn for f in (*FEATURES, *LATE_FEATURES)), drawn  # every feature ran in the crowd (FP8 K/V too)
    assert any(c.endswith("guided requests end with their grammar and match it") for c in ouro["checks"])
    assert any(c.endswith("budgeted requests close their reasoning by the budget") for c in ouro["checks"])
    crossing = next(c for c in ouro["checks"] if c.endswith("requests reach past one 64-key attention range"))
    assert int(crossing.split()[0]) >= 2, crossing  # the preamble carries requests past one range
    assert huginn["status"] == "pass", huginn
    assert "2 greedy requests vs the fp64 dense reference" in huginn["checks"]
    assert flipped["status"] == "fail" and flipped["detail"].startswith("r0 vs alone") and "token_ids[" in flipped["detail"]
    assert "[crowd: step " in flipped["detail"] and "; alone: step " in flipped["detail"], flipped  # what computed it
    assert flipped["alone_status"] == "fail" and "; alone: fail in " in flipped["detail"]  # run again alone, fails again
    assert [r["status"] for r in lines if r["id"] == "c002"] == ["fail", "fail"]
    assert aborted["status"] == "crash" and aborted["exit_code"] == -6
    assert hung["status"] == "timeout" and "engine built, 0 graph captures" in hung["stderr_tail"]  # where it stopped
    assert [r["status"] for r in lines if r["id"] == "c004"] == ["timeout", "timeout"]  # a hang hangs alone too
    assert [r["status"] for r in lines if r["id"] == "c005"] == ["timeout", "pass"]
    assert crowded["detail"].startswith(f"timed out after {HANG_LIMIT_S} s beside other cases; alone: pass in "), crowded
    assert "engine built" in crowded["stderr_tail_beside_others"]
    assert code == 1
    table = (tmp_path / "conformance.md").read_text()
    assert "pass: 3" in table and "fail: 1" in table and "crash: 1" in table and "timeout: 1" in table


def _config_error(model: str, **options) -> dict:
    """A child's result for an engine that refused these options (the real engine's message)."""
    with pytest.raises(ConfigError) as err:
        LLM(model, device="cpu", **options)
    return {"status": "config-error", "detail": str(err.value), "checks": [], "stats": {}}


def test_only_picks_cases_by_any_of_several_names(monkeypatch, tmp_path):
    """--only given twice runs the cases whose names contain either substring, nothing else."""
    picked = []
    monkeypatch.setattr(conformance, "run_matrix", lambda cases, *a: picked.extend(c["id"] for c in cases) or 0)
    assert conformance.main(["--out", str(tmp_path), "--cases", "12", "--device", "cpu",
                             "--only", "c003 ", "--only", "c010 "]) == 0
    assert picked == ["c003", "c010"]
    with pytest.raises(SystemExit):
        conformance.main(["--out", str(tmp_path), "--cases", "12", "--device", "cpu", "--only", "c099 "])


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

def test_matrix_draws_the_sampling_features_and_fp8():
    for device in ("cuda", "cpu"):
        cases = matrix(72, 0, device)
        assert {f for c in cases for f in c["features"]} == {*FEATURES, *LATE_FEATURES}
        assert any(c["new_weights"] and c["execution_mode"] != "eager" for c in cases) or device == "cpu"
        assert any(c["kv_cache_dtype"] == "fp8" for c in cases) and any(c["quantization"] == "fp8" for c in cases)
        assert any(c["features"] and c["speculative_config"] for c in cases)
    split = [c for c in matrix(72, 0, "cuda") if c["split_keys"]]
    assert any(c["speculative_config"] for c in split) and any(c["async_scheduling"] for c in split)
    assert any(c["kv_cache_dtype"] == "fp8" for c in split) and {c["model"] for c in split} == {"ouro-tiny", "huginn-tiny"}
    graphs = [c for c in matrix(72, 0, "cuda") if c["execution_mode"] == "graphs"]
    assert {f for c in graphs if c["async_scheduling"] for f in c["features"]} == {*FEATURES, *LATE_FEATURES}


def test_fp64_reference_applies_the_logit_processing():
    """A greedy request with penalties, bias, min_tokens and bad words: the engine's tokens agree
    with the fp64 reference; the same request's unprocessed tokens do not (the check has teeth)."""
    case = complete(0, dict(features=["bias-min-bad", "penalties"], requests=8, workload_seed=11))
    work = [w for w in build_workload(case, preset_config("ouro-tiny").vocab_size) if w.params.processes_logits and w.params.logit_bias]
    assert work
    w = work[0]
    llm = LLM("ouro-tiny", **alone_options(case, "cpu", False, 64, 1))
    got = run_alone(llm, w)
    assert reference_difference(case, w, [0], got) == ""
    plain = SamplingParams(max_tokens=w.params.max_tokens, temperature=0.0, ignore_eos=True, seed=w.params.seed,
                           stop_token_ids=w.params.stop_token_ids)
    unprocessed = run_alone(llm, type(w)(w.request_id, w.prompt, 0, plain))
    assert unprocessed[0]["token_ids"] != got[0]["token_ids"]
    assert "vs fp64 reference differ" in reference_difference(case, w, [0], unprocessed)


def test_a_slow_crowd_reports_its_progress(monkeypatch, capsys):
    """Every CROWD_PROGRESS_S the crowd writes its step, finished requests and graph captures to
    stderr, so a case killed at its limit shows whether it was stepping or stuck."""
    monkeypatch.setattr(conformance_case, "CROWD_PROGRESS_S", 0.0)
    case = complete(0, dict(requests=2))
    work = build_workload(case, preset_config("ouro-tiny").vocab_size)
    done, _ = run_crowd(LLM("ouro-tiny", **engine_options(case, "cpu")), work)
    assert len(done) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "crowd at step" in line]
    assert lines and lines[0].endswith("crowd at step 0, 0 of 2 requests done, 0 graph captures in 0.0 s")
    steps = [int(line.split("crowd at step ")[1].split(",")[0]) for line in lines]
    assert steps == list(range(len(steps))) and len(steps) > 2  # one line per step at a zero interval


@pytest.mark.parametrize("guided,sample,ok", [
    ({"regex": "[a-c]{2}-[0-9]{2}"}, {"text": "ab-12", "finish_reason": "stop"}, True),
    ({"regex": "[a-c]{2}-[0-9]{2}"}, {"text": "ab-123", "finish_reason": "stop"}, False),
    ({"regex": "[a-c]{2}-[0-9]{2}"}, {"text": "ab-1", "finish_reason": "length"}, False),
    ({"json": {"type": "object"}}, {"text": '{"a":7}', "finish_reason": "stop"}, True),
    ({"json": {"type": "object"}}, {"text": '{"a":17}', "finish_reason": "stop"}, False),
    ({"json": {"type": "object"}}, {"text": '{"a":7', "finish_reason": "stop"}, False),
])
def test_guided_check(guided, sample, ok):
    assert (guided_problem(GuidedDecoding.from_value(guided), sample) == "") == ok


@pytest.mark.parametrize("budget,tokens,ok", [
    (2, [9, 9, 3, 4, 5, 7], True),  # forced at the budget
    (2, [9, 3, 4, 5], True),  # closed by the model before it
    (2, [9, 9, 3], True),  # cut short inside the marker
    (0, [], True),
    (2, [9, 9, 9, 3, 4], False),  # one token late
    (2, [9, 9, 3, 5], False),  # the marker broken off
    (3, [9, 9], True),
])
def test_budget_check(budget, tokens, ok):
    assert (budget_problem(budget, [3, 4, 5], {"token_ids": tokens}) == "") == ok


def test_a_failed_crowd_runs_alone_with_its_draft_counts(monkeypatch):
    """The crowd records its greedy rounds' draft counts (the one choice that follows measured
    timings), and a case given them (`replay_drafts`) takes exactly those: here counts a
    max-drafting policy chose, which the engine's own policy would not, still pass against the
    requests run alone. A replay that runs out stops the crowd."""
    from rlt_runtime.engine.greedy_rounds import GreedyRounds

    case = complete(0, dict(speculative_config={"num_speculative_tokens": 2, "draft_policy": "adaptive",
                                                "draft_loops": None}, logprobs=2, requests=3, max_tokens=8,
                            workload_seed=5))
    natural = conformance_case.run_case(case)
    assert natural["status"] == "pass", natural
    with monkeypatch.context() as m:
        m.setattr(GreedyRounds, "drafts", lambda self, expected, fixed_tokens, fixed_k, rows, exploring=():
                  max(fixed_k, max((len(e) - 1 for e in expected), default=0)))
        greedy_max = conformance_case.run_case(case)
    tape = greedy_max["round_drafts"]
    assert tape and all(k == hi for k, _, hi in tape) and any(k > lo for k, lo, _ in tape)
    assert [r[0] for r in natural["round_drafts"]] != [r[0] for r in tape]
    replayed = conformance_case.run_case({**case, "replay_drafts": tape})
    assert replayed["status"] == "pass", replayed
    assert replayed["round_drafts"] == tape
    short = conformance_case.run_case({**case, "replay_drafts": tape[:1]})
    assert short["status"] == "fail" and "the replayed draft counts ran out at round 1" in short["detail"], short


def test_a_failure_reruns_alone_with_the_crowds_draft_counts():
    """rerun_failure_alone hands the failed run's round_drafts to the rerun and says so."""
    seen = []

    def run(case):
        seen.append(case)
        return {"status": "pass", "duration_s": 3.0, "detail": ""}

    row = {"id": "c000", "case": complete(0, {}), "status": "fail", "detail": "r0 vs alone: x",
           "round_drafts": [[1, 0, 1], [0, 0, 1]]}
    again = conformance.rerun_failure_alone(row, run)
    assert seen[0]["alone"] and seen[0]["replay_drafts"] == [[1, 0, 1], [0, 0, 1]]
    assert again["status"] == "fail" and again["alone_status"] == "pass"
    assert again["detail"] == "r0 vs alone: x; alone, same draft counts: pass in 3 s"
    plain = conformance.rerun_failure_alone({**row, "round_drafts": None}, run)
    assert seen[1]["replay_drafts"] is None and plain["detail"].endswith("; alone: pass in 3 s")
