"""`rlt-bench serve` against a live server, its metric arithmetic, and the subcommand dispatch."""

from __future__ import annotations

import json
import sys
import types

import pytest

from rlt_runtime.entrypoints import bench


def _run(args: list[str], tmp_path) -> dict:
    path = tmp_path / "result.json"
    assert bench.main(["serve", *args, "--result-file", str(path)]) == 0
    return json.loads(path.read_text())


def test_serve_random_completions(server, tmp_path, capsys):
    report = _run(["--base-url", server.url, "--num-prompts", "6", "--num-warmups", "1", "--random-input-len", "8",
                   "--random-output-len", "4", "--ignore-eos", "--request-rate", "50", "--seed", "3",
                   "--goodput", "ttft:600000", "tpot:600000", "e2e:600000"], tmp_path)
    assert report["completed"] == 6 and report["failed"] == 0 and report["num_prompts"] == 6
    assert report["model"] == "ouro-tiny" and report["backend"] == "openai"
    assert report["input_lens"] == [8] * 6 and report["output_lens"] == [4] * 6
    assert report["total_input_tokens"] == 48 and report["total_output_tokens"] == 24
    assert report["request_goodput"] == pytest.approx(report["request_throughput"])
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert report[f"mean_{name}_ms"] > 0
        assert report[f"p50_{name}_ms"] <= report[f"p90_{name}_ms"] <= report[f"p99_{name}_ms"]
    assert all(0 < t < e for t, e in zip(report["ttfts"], report["e2els"]))
    assert all(1 <= len(itl) <= 3 for itl in report["itls"])  # one gap per later token chunk
    assert report["output_throughput"] == pytest.approx(24 / report["duration"])
    assert "Successful requests" in capsys.readouterr().out


def test_serve_sharegpt_chat_with_concurrency_limit(server, tmp_path):
    conversations = [{"id": str(i), "conversations": [
        {"from": "human", "value": f"Question number {i}: what is a looped model?"},
        {"from": "gpt", "value": "A model that reuses its layers several times."}]} for i in range(6)]
    conversations.append({"id": "short", "conversations": [{"from": "human", "value": "hi"}]})  # skipped: one turn
    data = tmp_path / "sharegpt.json"
    data.write_text(json.dumps(conversations))
    report = _run(["--base-url", server.url, "--endpoint", "/v1/chat/completions", "--dataset-name", "sharegpt",
                   "--dataset-path", str(data), "--num-prompts", "4", "--num-warmups", "0", "--sharegpt-output-len", "3",
                   "--ignore-eos", "--max-concurrency", "2"], tmp_path)
    assert report["completed"] == 4 and report["backend"] == "openai-chat"
    assert report["output_lens"] == [3] * 4 and report["peak_concurrency"] <= 2
    assert all(n > 40 for n in report["input_lens"])  # the chat template wraps the question


def test_summarize_goodput_and_percentiles():
    results = [bench.RequestResult(success=True, prompt_len=10, output_len=5, ttft=0.1, e2el=0.5, itl=[0.1] * 4),
               bench.RequestResult(success=True, prompt_len=10, output_len=5, ttft=0.3, e2el=1.3, itl=[0.25] * 4),
               bench.RequestResult(success=False, error="HTTP 500")]
    report = bench.summarize(results, 2.0, [50, 90], {"ttft": 200.0, "tpot": 150.0})
    assert report["completed"] == 2 and report["failed"] == 1
    assert report["request_goodput"] == pytest.approx(0.5)  # only the first meets both SLOs
    assert report["mean_tpot_ms"] == pytest.approx((100 + 250) / 2)
    assert report["p90_ttft_ms"] == pytest.approx(100 + 0.9 * 200)
    assert report["total_token_throughput"] == pytest.approx(30 / 2.0)


def test_bad_goodput_spec_is_rejected():
    with pytest.raises(SystemExit) as exc:
        bench.main(["serve", "--goodput", "latency:5"])
    assert exc.value.code == 2


def test_offline_subcommands_dispatch(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "rlt_runtime.entrypoints.bench_offline", None)
    assert bench.main(["throughput", "--model", "x"]) == 2
    assert "bench_offline" in capsys.readouterr().err
    seen = []
    fake = types.ModuleType("rlt_runtime.entrypoints.bench_offline")
    fake.throughput_main = lambda argv: seen.append(("throughput", argv)) or 0
    fake.latency_main = lambda argv: seen.append(("latency", argv)) or 3
    monkeypatch.setitem(sys.modules, "rlt_runtime.entrypoints.bench_offline", fake)
    assert bench.main(["throughput", "--model", "x"]) == 0
    assert bench.main(["latency"]) == 3
    assert seen == [("throughput", ["--model", "x"]), ("latency", [])]
    assert bench.main(["nonsense"]) == 2


def test_serve_sampling_and_loop_flags_reach_the_engine(server, tmp_path, submitted_params):
    seen = submitted_params
    report = _run(["--base-url", server.url, "--num-prompts", "2", "--num-warmups", "0", "--random-input-len", "4",
                   "--random-output-len", "3", "--ignore-eos", "--top-p", "0.9", "--top-k", "7", "--sampling-seed", "4",
                   "--exit-threshold", "0.3", "--min-loops", "2", "--max-loops", "3"], tmp_path)
    assert report["completed"] == 2 and len(seen) == 2
    for p in seen:
        assert (p.top_p, p.top_k, p.seed, p.exit_threshold, p.min_loops, p.max_loops) == (0.9, 7, 4, 0.3, 2, 3)
    seen.clear()
    _run(["--base-url", server.url, "--num-prompts", "1", "--num-warmups", "0", "--random-input-len", "4",
          "--random-output-len", "2"], tmp_path)
    assert (seen[0].top_p, seen[0].seed, seen[0].exit_threshold, seen[0].max_loops) == (1.0, None, 1.0, None)
