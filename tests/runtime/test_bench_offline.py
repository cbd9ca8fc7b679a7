"""`rlt-bench throughput` / `latency` (offline, in-process) on the CPU engine: token accounting."""

import gc
import json

from rlt_runtime import LLM
from rlt_runtime.entrypoints.bench_offline import decode_benchmark, latency_main, throughput_main


def test_decode_benchmark_counts_every_decoded_token():
    llm = LLM("ouro-tiny", dtype="float32", max_num_seqs=4)
    r = decode_benchmark(llm, 3, 6, 5, prefix="count")
    assert r["decode_tokens"] == 3 * 4  # each request's first token comes from its prefill
    assert r["decode_steps"] >= 4 and r["tok_per_s"] > 0 and r["mean_depth"] == 4.0
    assert not llm.engine.has_unfinished_requests()


def test_throughput_and_latency_commands_write_json(tmp_path):
    out = tmp_path / "t.json"
    assert throughput_main(["--model", "ouro-tiny", "--batch", "2", "--input-len", "4", "--output-len", "3",
                            "--output-json", str(out)]) == 0
    assert gc.get_freeze_count() > 0  # the started engine left the collector's scans (engine.heap)
    result = json.loads(out.read_text())
    assert result["decode_tokens"] == 2 * 2 and result["engine"]["running"] == 0
    assert latency_main(["--model", "ouro-tiny", "--input-len", "4", "--output-len", "3", "--iters", "2",
                         "--output-json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 2 and all(r["decode_tokens"] == 2 for r in result["runs"])
    assert result["ttft_s"] > 0 and result["tpot_ms"] > 0


def _bench(tmp_path, command, *flags: str) -> dict:
    out = tmp_path / "r.json"
    assert command(["--model", "ouro-tiny", "--dtype", "float32", "--batch", "2", "--input-len", "4",
                    "--output-len", "6", "--output-json", str(out), *flags]) == 0
    return json.loads(out.read_text())


def test_sampling_and_exit_flags_reach_every_request(tmp_path):
    r = _bench(tmp_path, throughput_main, "--temperature", "0.7", "--top-p", "0.9", "--top-k", "50",
               "--sampling-seed", "5", "--exit-threshold", "0.3", "--min-loops", "2")
    sp = r["sampling_params"]
    assert (sp["temperature"], sp["top_p"], sp["top_k"], sp["seed"], sp["exit_threshold"], sp["min_loops"]) == (
        0.7, 0.9, 50, 5, 0.3, 2)
    assert sp["max_tokens"] == 6 and sp["ignore_eos"]
    assert 2.0 <= r["mean_depth"] < 4.0  # tokens exit early, never before min_loops
    capped = _bench(tmp_path, latency_main, "--max-loops", "1", "--iters", "1")
    assert capped["runs"][0]["mean_depth"] == 1.0 and capped["runs"][0]["sampling_params"]["max_loops"] == 1


def test_speculative_flags_reach_the_engine(tmp_path):
    flags = ("--speculative-tokens", "2", "--draft-loops", "1", "--draft-policy", "fixed")
    r = _bench(tmp_path, throughput_main, *flags)
    spec = r["engine"]["speculative"]
    assert spec["rounds"] > 0 and spec["drafted"] > 0 and set(spec["chosen_k"]) <= {"0", "1", "2"}
    assert len(spec["drafted_per_position"]) == 2
    lat = _bench(tmp_path, latency_main, "--iters", "1", *flags)
    assert lat["engine"]["speculative"]["rounds"] > 0
    opted_out = _bench(tmp_path, throughput_main, "--no-speculative", *flags)
    assert opted_out["engine"]["speculative"]["rounds"] == 0 and not opted_out["sampling_params"]["speculative"]


def test_uniform_exit_trace_replays_by_row_across_runs(tmp_path):
    r = _bench(tmp_path, latency_main, "--uniform-exit-trace", "--iters", "2")
    means = [run["mean_depth"] for run in r["runs"]]
    assert means[0] == means[1] and 1.0 <= means[0] < 4.0  # each run replays the same rows' depths
    assert _bench(tmp_path, throughput_main, "--uniform-exit-trace", "--num-loops", "3")["mean_depth"] < 3.0


def test_bench_option_errors_exit_2(tmp_path, capsys):
    assert throughput_main(["--model", "ouro-tiny", "--uniform-exit-trace", "--exit-mode", "ouro"]) == 2
    assert "--uniform-exit-trace replays its own trace" in capsys.readouterr().err
    assert latency_main(["--model", "ouro-tiny", "--top-p", "0"]) == 2
    assert "top_p must be a number in (0, 1]" in capsys.readouterr().err
