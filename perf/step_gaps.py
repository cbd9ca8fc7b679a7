"""Where a decode run loses time between device work (GPU).

    python -m perf.step_gaps --out out/gaps [--model ouro-1.4b] [--batch 256] [--early-exit]
        [--quantization w8a8_fp8] [--kv-cache-dtype fp8]

Runs `batch` requests (prompt 128, output 128, greedy, ignore_eos) twice and records, per decode
step, the wall time between `step()` returns, the engine's host and device times
(`LLMEngine.timings`) and every garbage collection (generation, ms); then profiles six steady
steps with torch.profiler (CPU + CUDA) and lists the GPU idle gaps over 50 µs (--min-gap-us) with the CPU calls
spanning each. A step whose wall time exceeds its device time by more than a millisecond is
host-bound there; `steps_over_device` lists them. The second run also profiles the engine's
Python (cProfile) from the step where the first request finishes to the end: `finishing_profile`
holds the functions with the most cumulative time. Writes `step_gaps.json` and the gzipped trace.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import gzip
import json
import os
import shutil
import time

import torch

from perf.bench_engine import device_events, engine
from rlt_runtime import SamplingParams
from rlt_runtime.entrypoints.bench_offline import random_prompts, row_trace_ids, uniform_trace
from rlt_runtime.models.presets import preset_config


def _add_requests(eng, prefix: str, batch: int, max_tokens: int, seed: int, early_exit: bool) -> None:
    """`batch` greedy requests (prompt 128, ignore_eos); with early_exit each replays its row's
    entry of the exit trace."""
    traces = row_trace_ids(batch) if early_exit else [None] * batch
    for i, p in enumerate(random_prompts(batch, 128, eng.model_config.vocab_size, seed=seed)):
        eng.add_request(f"{prefix}-{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                                           trace_id=traces[i]))


def _decode_series(eng, batch: int, seed: int, profile_finishing: bool = False, early_exit: bool = False) -> dict:
    _add_requests(eng, f"gaps{seed}", batch, 128, seed, early_exit)
    first = {}
    while len(first) < batch or not all(first.values()):
        for o in eng.step():
            first[o.request_id] = len(o.outputs[0].token_ids)
    torch.cuda.synchronize()
    collections, started = [], [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            collections.append({"generation": info["generation"], "ms": (time.perf_counter() - started[0]) * 1e3})

    eng.timings = []
    gc.callbacks.append(on_gc)
    stamps = [time.perf_counter()]
    profile = cProfile.Profile() if profile_finishing else None
    profiling = False
    while eng.has_unfinished_requests():
        finished = eng.step(final_only=True)
        stamps.append(time.perf_counter())
        if profile is not None and finished and not profiling:
            profiling = True
            profile.enable()
    if profiling:
        profile.disable()
    gc.callbacks.remove(on_gc)
    wall = [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
    timings, eng.timings = eng.timings, None
    over = [{"step": i, "wall_ms": w, "host_ms": h, "device_ms": d}
            for i, (w, (h, d)) in enumerate(zip(wall[1:], timings[1:]), 1) if d is not None and w > d + 1.0]
    res = {"wall_ms": wall, "host_device_ms": timings, "collections": collections, "steps_over_device": over,
           "wall_total_ms": sum(wall), "device_total_ms": sum(d or 0.0 for _, d in timings)}
    if profiling:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("cumulative").print_stats(30)
        res["finishing_profile"] = text.getvalue()
    return res


def _idle_gaps(trace_path: str, min_us: float = 50.0) -> list[dict]:
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    device = sorted((e["ts"], e["ts"] + e.get("dur", 0)) for e in device_events(events))
    host = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver")]
    gaps, end = [], device[0][1]
    for start, stop in device[1:]:
        if start - end > min_us:
            spanning = sorted(((c.get("dur", 0), c["name"][:80]) for c in host
                               if c["ts"] <= start and c["ts"] + c.get("dur", 0) >= end and c.get("dur", 0) > 20),
                              reverse=True)[:6]
            gaps.append({"at_us": end - device[0][0], "idle_us": start - end, "cpu_calls": spanning})
        end = max(end, stop)
    return gaps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="ouro-1.4b")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--min-gap-us", type=float, default=50.0, help="list device idle gaps longer than this")
    ap.add_argument("--early-exit", action="store_true",
                    help="replay decode depths drawn uniformly from 1..depth (exit_mode trace), as perf.bench_engine's early exit")
    ap.add_argument("--quantization", default=None, help="engine option, e.g. w8a8_fp8")
    ap.add_argument("--kv-cache-dtype", default="auto", help="engine option, e.g. fp8")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    options = {"quantization": args.quantization, "kv_cache_dtype": args.kv_cache_dtype}
    if args.early_exit:
        depth = preset_config(args.model).num_loops
        options.update(exit_mode="trace", exit_trace=uniform_trace(row_trace_ids(args.batch), depth, 128))
    llm, meta = engine(args.model, max_num_seqs=args.batch, **options)
    eng = llm.engine
    res = {"meta": meta, "early_exit": args.early_exit,
           "runs": [_decode_series(eng, args.batch, seed, profile_finishing=seed == 1, early_exit=args.early_exit)
                    for seed in range(2)]}
    for r in res["runs"]:
        print(f"wall {r['wall_total_ms']:.0f} ms, device {r['device_total_ms']:.0f} ms, collections over 1 ms:",
              [c for c in r["collections"] if c["ms"] > 1], "steps over device:", len(r["steps_over_device"]), flush=True)
    print(res["runs"][1].get("finishing_profile", ""), flush=True)
    _add_requests(eng, "gaps-profile", args.batch, 40, 9, args.early_exit)
    for _ in range(20):  # prefill, then steady decode
        eng.step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(6):
            eng.step(final_only=True)
        torch.cuda.synchronize()
    while eng.has_unfinished_requests():
        eng.step()
    trace = os.path.join(args.out, "trace.json")
    prof.export_chrome_trace(trace)
    res["profile_idle_gaps"] = _idle_gaps(trace, args.min_gap_us)
    print(f"idle gaps over {args.min_gap_us:g} us in six steady steps:", [(round(g["at_us"]), round(g["idle_us"])) for g in res["profile_idle_gaps"]])
    with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(trace)
    with open(os.path.join(args.out, "step_gaps.json"), "w") as f:
        json.dump(res, f, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
