"""CUDA graphs against torch.compile on one GPU: the same engine in both execution modes.

    python -m perf.bench_compile --out out/compile

`ouro-1.4b` preset, bf16, decode buckets 1 and 16 and one prefill token bucket of 16 (Inductor
takes about a minute per bucket of the full model), prompt 128, output 128, greedy, `ignore_eos`. Reports
decode tok/s at batch 1 and 16 per mode, compile and capture seconds apart from run time, failed
captures and fallbacks, and whether both modes produced the same tokens.
"""

from __future__ import annotations

import logging
import time

from perf.bench_engine import engine, free_engine
from perf.report import bench_main
from rlt_runtime import SamplingParams
from rlt_runtime.entrypoints.bench_offline import decode_benchmark, random_prompts

BATCHES = (1, 16)
OPTIONS = dict(max_num_seqs=16, cuda_graph_sizes=[1, 16], max_num_batched_tokens=16)


def run(out_dir: str, quick: bool) -> dict:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")  # per-bucket compile times
    res: dict = {"date": time.strftime("%Y-%m-%d"), "modes": {}}
    tokens = {}
    for mode in ("graphs", "compile"):
        llm, meta = engine("ouro-1.4b", execution_mode=mode, **OPTIONS)
        row = {"init_s": meta["init_s"]}
        prompts = random_prompts(4, 128, llm.engine.model_config.vocab_size, 7)
        outs = llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
        tokens[mode] = [o.outputs[0].token_ids for o in outs]
        for b in BATCHES:
            row[b] = decode_benchmark(llm, b, 128, 32 if quick else 128, prefix=f"{mode}{b}")
            print(mode, b, row[b], flush=True)
        st = llm.stats()  # after the runs: replays and fallbacks included
        row.update(decode_graphs=st["graphs"], prefill_graphs=st["prefill_graphs"])
        res["modes"][mode] = row
        del llm
        free_engine()
    res["same_tokens"] = tokens["graphs"] == tokens["compile"]
    return res


def markdown(res: dict) -> str:
    lines = [f"Measured {res['date']}; ouro-1.4b bf16, prompt 128; greedy tokens identical across modes: "
             f"{res['same_tokens']}.", "",
             "| mode | batch 1 tok/s | batch 16 tok/s | compile s | capture s | failed captures | replays | fallbacks |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, r in res["modes"].items():
        programs = [r["decode_graphs"] or {}, r["prefill_graphs"] or {}]
        total = lambda key: sum(g.get(key, 0) for g in programs)  # noqa: E731 - decode and prefill programs
        lines.append(
            f"| {mode} | {r[1]['tok_per_s']:.0f} | {r[16]['tok_per_s']:.0f} | {total('compile_seconds'):.1f} | "
            f"{total('capture_seconds'):.1f} | {total('failed_captures')} | {total('replays')} | {total('fallbacks')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    bench_main("compile", run, markdown)
