"""`rlt-bench throughput` / `latency` (offline, in-process) on the CPU engine: token accounting."""

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
    result = json.loads(out.read_text())
    assert result["decode_tokens"] == 2 * 2 and result["engine"]["running"] == 0
    assert latency_main(["--model", "ouro-tiny", "--input-len", "4", "--output-len", "3", "--iters", "2",
                         "--output-json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 2 and all(r["decode_tokens"] == 2 for r in result["runs"])
    assert result["ttft_s"] > 0 and result["tpot_ms"] > 0
