"""End-to-end engine benchmark on one GPU, in one run (results: JSON, markdown table, plot).

    python -m perf.bench_engine --out out/engine

Measures in the same process: the copy bandwidth and bf16 GEMM rate (the roofline), a
plain-PyTorch Ouro-1.4B decode step captured whole in one CUDA graph (the baseline), and rlt on
the `ouro-1.4b` preset in bf16: decode steady state (prompt 128, output 128, ignore_eos) at batch
1, 16, 64, 256 at fixed depth and with early exit at mean depth 2.5 (exit-trace replay of
uniform depths 1..4), the cost of batch invariance (cuBLAS linear layers instead), prefill
throughput at 2K-token prompts, and `ouro-2.6b` / `huginn-0125` at batch 1. Every figure is
reported beside the floor implied by the measured roofline and beside the baseline, with kernel
profiles (torch.profiler) of a fixed-depth step at the smallest and largest batch, of an early-exit
step and of a prefill step.
"""

from __future__ import annotations

import gc
import json
import os
import time

import torch

from perf.report import bench_main
from perf.roofline import measure
from rlt_runtime.entrypoints.bench_offline import decode_benchmark, prefill_benchmark, uniform_trace

BATCHES = [1, 16, 64, 256]


def free_engine():
    """After dropping an `engine()`: thaw the heap it froze (so the dropped engine's reference
    cycles can be collected), collect, and give cached GPU memory back."""
    gc.unfreeze()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def weight_bytes_per_step(cfg, depth) -> int:
    """Bytes of weights one full-depth decode step reads (each loop re-reads its layers)."""
    from rlt_runtime.models.configs import hf_weight_shapes

    shapes = hf_weight_shapes(cfg)
    total = 0
    for name, shape in shapes.items():
        n = 1
        for s in shape:
            n *= s
        if cfg.family == "ouro":
            if ".layers." in name:
                total += n * depth
            elif "embed_tokens" not in name:
                total += n
        else:
            if ".core_block." in name or "adapter" in name:
                total += n * depth
            elif name != "transformer.wte.weight":
                total += n
    if cfg.family == "huginn":
        total += cfg.vocab_size * cfg.n_embd  # tied head read once
    return 2 * total


def floor_ms(cfg, depth, batch, roof, ctx=192, *, weight_bytes=None, kv_elem_bytes=2) -> float:
    """max(bytes / bandwidth, FLOPs / GEMM rate) of one decode step (weights + KV reads).
    weight_bytes: the step's weight bytes when they are not bf16 (FP8: `perf.bench_fp8`);
    kv_elem_bytes: bytes of one cached K/V element (1 for an FP8 cache)."""
    bf16_bytes = weight_bytes_per_step(cfg, depth)
    wbytes = bf16_bytes if weight_bytes is None else weight_bytes
    layers = cfg.num_hidden_layers if cfg.family == "ouro" else cfg.n_layers_in_recurrent_block
    kv = batch * ctx * 2 * cfg.kv_heads * cfg.head_dim * kv_elem_bytes * layers * depth
    flops = batch * bf16_bytes  # 2 FLOPs per weight parameter = bytes in bf16
    return max((wbytes + kv) / (roof["copy_gbps"] * 1e9), flops / (roof["gemm_tflops"] * 1e12)) * 1e3


def engine(model, **kw):
    """An `LLM` (bf16, engine options kw) as the benchmarks time it: the heap frozen once it has
    started, as `rlt-generate` and `rlt-serve` freeze theirs (`freeze_heap`: no full collection
    scans the engine mid-step), and every step's device time recorded. Returns (llm, {init_s,
    capture_s, captures}); drop it with `del llm; free_engine()`."""
    from rlt_runtime import LLM
    from rlt_runtime.engine.heap import freeze_heap

    t0 = time.perf_counter()
    llm = LLM(model, dtype="bfloat16", **kw)
    freeze_heap()
    llm.engine.executor.worker.runner.record_device_time = True
    st = llm.stats()
    programs = [st.get("graphs") or {}, st.get("prefill_graphs") or {}]  # decode rows and prefill tokens
    return llm, {"init_s": time.perf_counter() - t0, "capture_s": sum(g.get("capture_seconds", 0) for g in programs),
                 "captures": sum(g.get("captures", 0) for g in programs)}


def _profiled(run_steps, steps: int, top: int) -> dict:
    """Device time by kernel over `run_steps()` (torch.profiler / CUPTI, which also sees the kernels
    inside CUDA-graph replays), per step of the `steps` it runs."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run_steps()
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    kernels = []
    for e in prof.key_averages():
        us = e.self_device_time_total / steps
        if us > 0:
            kernels.append({"kernel": e.key[:90], "calls_per_step": e.count / steps, "us_per_step": us})
    kernels.sort(key=lambda k: -k["us_per_step"])
    busy_ms = sum(k["us_per_step"] for k in kernels) / 1e3
    return {"wall_ms_per_step": wall_ms, "kernel_ms_per_step": busy_ms,
            "kernels_per_step": sum(k["calls_per_step"] for k in kernels), "top": kernels[:top],
            "marginal": _marginal(prof, steps, top)}


def _marginal(prof, steps: int, top: int) -> dict:
    """`marginal_times` of a torch.profiler run's device events."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        with open(f.name) as trace:
            return marginal_times(json.load(trace)["traceEvents"], steps, top)


def device_events(events: list) -> list:
    """The device's work among chrome-trace events: kernels, copies and sets ("X" events, µs)."""
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def marginal_times(events: list, steps: int, top: int) -> dict:
    """What each kernel adds to the device timeline, per step: with dependent launches a kernel starts
    before its predecessor ends and waits, so its own duration overstates it. Device events (chrome
    trace "X" events of kernels, copies and sets; µs) in order of their ends, which on one stream is
    their launch order; each adds end - max(previous end, its start) (`us_per_step`), and an idle
    stretch before a kernel that starts after the previous end is charged to that kernel
    (`idle_us_per_step`). The additions and idle stretches sum to the span."""
    device = sorted((e["ts"] + e.get("dur", 0), e["ts"], e["name"][:90]) for e in device_events(events))
    by_name: dict = {}
    first = min((start for _, start, _ in device), default=0.0)
    prev_end = first
    for end, start, name in device:
        k = by_name.setdefault(name, {"kernel": name, "calls_per_step": 0.0, "us_per_step": 0.0, "idle_us_per_step": 0.0})
        k["calls_per_step"] += 1 / steps
        k["us_per_step"] += max(0.0, end - max(prev_end, start)) / steps
        k["idle_us_per_step"] += max(0.0, start - prev_end) / steps
        prev_end = max(prev_end, end)
    ranked = sorted(by_name.values(), key=lambda k: -(k["us_per_step"] + k["idle_us_per_step"]))
    span = (device[-1][0] - first) / steps if device else 0.0
    return {"span_us_per_step": span, "idle_us_per_step": sum(k["idle_us_per_step"] for k in ranked),
            "top": ranked[: max(top, 30)]}


def kernel_breakdown(llm, batch: int, steps: int = 8, top: int = 14) -> dict:
    """Device time per steady-state decode step, by kernel: the profile that explains a step's time."""
    from rlt_runtime import SamplingParams
    from rlt_runtime.entrypoints.bench_offline import random_prompts

    eng = llm.engine
    params = SamplingParams(max_tokens=steps + 24, temperature=0, ignore_eos=True)
    for i, p in enumerate(random_prompts(batch, 128, eng.model_config.vocab_size, seed=7)):
        eng.add_request(f"prof{batch}-{i}", p, params)
    for _ in range(16):  # prefill, then a few decode steps
        eng.step()

    def run_steps():
        for _ in range(steps):
            eng.step()

    res = {"batch": batch, **_profiled(run_steps, steps, top)}
    while eng.has_unfinished_requests():
        eng.step()
    return res


def prefill_breakdown(llm, num: int, input_len: int, top: int = 14) -> dict:
    """Device time by kernel of prefilling `num` prompts of `input_len` tokens (max_tokens=1), per
    engine step (each step prefills up to max_num_batched_tokens prompt tokens)."""
    from rlt_runtime import SamplingParams
    from rlt_runtime.entrypoints.bench_offline import random_prompts

    eng = llm.engine
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    for i, p in enumerate(random_prompts(num, input_len, eng.model_config.vocab_size, seed=11)):
        eng.add_request(f"prefill-prof-{i}", p, params)
    steps = -(-num * input_len // eng.max_num_batched_tokens)

    def run_steps():
        while eng.has_unfinished_requests():
            eng.step()

    return {"prompts": num, "input_len": input_len, "tokens_per_step": eng.max_num_batched_tokens,
            **_profiled(run_steps, steps, top)}


def run(out_dir: str, quick: bool) -> dict:
    roof = measure()
    res: dict = {"roofline": roof, "date": time.strftime("%Y-%m-%d"), "baseline": {}, "rlt": {}, "early_exit": {},
                 "cublas": {}, "prefill": None, "other_models": {}}
    print("roofline", roof, flush=True)
    from rlt_runtime.models.presets import preset_config, preset_weights

    cfg = preset_config("ouro-1.4b")
    batches = [1, 16] if quick else BATCHES
    if os.environ.get("RLT_ENGINE_BATCHES"):  # e.g. "1,64,256"
        batches = [int(b) for b in os.environ["RLT_ENGINE_BATCHES"].split(",")]
    # RLT_ENGINE_PARTS narrows a run to some of: early_exit, cublas, other (baseline, fixed-depth
    # decode, kernel breakdown and prefill always run).
    parts = set(os.environ.get("RLT_ENGINE_PARTS", "early_exit,cublas,other").split(","))

    # Plain PyTorch, whole step in one CUDA graph.
    from perf.torch_baseline import TorchOuroDecode

    w = dict(preset_weights(cfg, device="cuda", dtype=torch.bfloat16))
    for b in batches:
        base = TorchOuroDecode(cfg, w, b, 256)
        ms = base.step_ms()
        res["baseline"][b] = {"ms_per_step": ms, "tok_per_s": b / ms * 1e3}
        print("baseline", b, res["baseline"][b], flush=True)
        del base
        free_engine()
    del w
    free_engine()

    torch.cuda.reset_peak_memory_stats()
    llm, meta = engine("ouro-1.4b", max_num_seqs=max(batches))
    res["rlt_meta"] = meta
    decode_benchmark(llm, 4, 32, 8, prefix="warm")
    for b in batches:
        r = decode_benchmark(llm, b, 128, 128, prefix=f"fixed{b}")
        r["floor_ms"] = floor_ms(cfg, 4, b, roof)
        r["frac_floor"] = r["floor_ms"] / r["ms_per_step"]
        r["vs_baseline"] = r["tok_per_s"] / res["baseline"][b]["tok_per_s"]
        res["rlt"][b] = r
        print("rlt", b, r, flush=True)
    res["breakdown"] = {b: kernel_breakdown(llm, b) for b in (batches[0], batches[-1])}
    print("breakdown", res["breakdown"], flush=True)
    res["prefill"] = prefill_benchmark(llm, 8 if quick else 16, 2048)
    flops_tok = weight_bytes_per_step(cfg, 4)  # 2 FLOPs/param = bytes in bf16; attention excluded
    res["prefill"]["frac_compute_floor"] = res["prefill"]["tok_per_s"] * flops_tok / (roof["gemm_tflops"] * 1e12)
    print("prefill", res["prefill"], flush=True)
    res["prefill_breakdown"] = prefill_breakdown(llm, 4, 2048)
    print("prefill breakdown", res["prefill_breakdown"], flush=True)
    res["rlt_meta"]["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    res["rlt_meta"]["stats"] = llm.stats()
    del llm
    free_engine()

    if "early_exit" not in parts:
        return _other_parts(res, roof, batches, parts, quick)
    ids = [f"ee{b}-{i}" for b in batches for i in range(b)] + [f"prof{batches[-1]}-{i}" for i in range(batches[-1])]
    llm, meta = engine("ouro-1.4b", max_num_seqs=max(batches), exit_mode="trace",
                       exit_trace=uniform_trace(ids + [f"warm-{i}" for i in range(4)], 4, 128))
    decode_benchmark(llm, 4, 32, 8, prefix="warm")
    for b in batches:
        r = decode_benchmark(llm, b, 128, 128, prefix=f"ee{b}")
        r["speedup_vs_fixed"] = r["tok_per_s"] / res["rlt"][b]["tok_per_s"]
        res["early_exit"][b] = r
        print("early exit", b, r, flush=True)
    res["early_exit_breakdown"] = {batches[-1]: kernel_breakdown(llm, batches[-1])}  # where an early-exit step goes
    print("early exit breakdown", res["early_exit_breakdown"], flush=True)
    del llm
    free_engine()

    return _other_parts(res, roof, batches, parts, quick)


def _other_parts(res: dict, roof: dict, batches: list[int], parts: set, quick: bool) -> dict:
    """The cuBLAS (batch_invariant=False) comparison and the other models at batch 1."""
    if "cublas" not in parts:
        return _other_models(res, roof, batches, parts, quick)
    llm, _ = engine("ouro-1.4b", max_num_seqs=max(batches), batch_invariant=False)
    decode_benchmark(llm, 4, 32, 8, prefix="warm")
    for b in (batches[0], batches[-1]):
        r = decode_benchmark(llm, b, 128, 128, prefix=f"cublas{b}")
        r["invariance_cost"] = r["tok_per_s"] / res["rlt"][b]["tok_per_s"] - 1.0
        res["cublas"][b] = r
        print("cublas", b, r, flush=True)
    del llm
    free_engine()

    return _other_models(res, roof, batches, parts, quick)


def _other_models(res: dict, roof: dict, batches: list[int], parts: set, quick: bool) -> dict:
    from rlt_runtime.models.presets import preset_config

    if "other" not in parts:
        return res
    for model in (["ouro-2.6b"] if quick else ["ouro-2.6b", "huginn-0125"]):
        mcfg = preset_config(model)
        llm, meta = engine(model, max_num_seqs=1)
        decode_benchmark(llm, 1, 16, 4, prefix="warm")
        r = decode_benchmark(llm, 1, 128, 32 if model.startswith("huginn") else 128, prefix="one")
        depth = mcfg.num_loops
        r["floor_ms"] = floor_ms(mcfg, depth, 1, roof)
        r["frac_floor"] = r["floor_ms"] / r["ms_per_step"]
        r.update(meta)
        res["other_models"][model] = r
        print(model, r, flush=True)
        del llm
        free_engine()
    return res


def markdown(res: dict) -> str:
    roof = res["roofline"]
    lines = [
        f"Measured {res['date']} on {roof['gpu']} (torch {roof['torch']}, triton {roof['triton']}): "
        f"copy {roof['copy_gbps']:.0f} GB/s, bf16 GEMM {roof['gemm_tflops']:.0f} TFLOP/s.",
        "",
        "| batch | rlt tok/s | ms/step | floor ms | of floor | host ms | device ms | PyTorch graph tok/s | vs PyTorch | early exit tok/s (depth) | exit speedup |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b, r in res["rlt"].items():
        e = res["early_exit"].get(b, {})
        base = res["baseline"].get(b, {})
        fmt = lambda v, f="{:.2f}": "n/a" if v is None else f.format(v)  # noqa: E731
        lines.append(
            f"| {b} | {r['tok_per_s']:.0f} | {r['ms_per_step']:.2f} | {r['floor_ms']:.2f} | {r['frac_floor']:.0%} | "
            f"{fmt(r['host_ms_per_step'])} | {fmt(r['device_ms_per_step'])} | {base.get('tok_per_s', 0):.0f} | "
            f"{r['vs_baseline']:.1f}x | {e.get('tok_per_s', 0):.0f} ({fmt(e.get('mean_depth'))}) | {fmt(e.get('speedup_vs_fixed'))}x |"
        )
    p = res.get("prefill")
    if p:
        lines += ["", f"Prefill, {p['num']} prompts x {p['input_len']} tokens: {p['tok_per_s']:.0f} tok/s "
                      f"({p['frac_compute_floor']:.0%} of the compute floor)."]
    for b, r in res.get("cublas", {}).items():
        lines.append(f"cuBLAS linear layers (not batch invariant), batch {b}: {r['tok_per_s']:.0f} tok/s "
                     f"({r['invariance_cost']:+.1%} vs batch-invariant).")
    for m, r in res.get("other_models", {}).items():
        lines.append(f"{m}, batch 1: {r['tok_per_s']:.1f} tok/s, {r['ms_per_step']:.2f} ms/step, "
                     f"{r['frac_floor']:.0%} of the {r['floor_ms']:.2f} ms floor.")
    meta = res.get("rlt_meta", {})
    lines.append(f"ouro-1.4b engine: init {meta.get('init_s', 0):.1f} s, graph capture {meta.get('capture_s') or 0:.1f} s "
                 f"({meta.get('captures')} decode and prefill graphs), peak memory {meta.get('peak_gib', 0):.1f} GiB.")
    breakdowns = [(f"decode step at batch {b}", bd) for b, bd in res.get("breakdown", {}).items()]
    breakdowns += [(f"early-exit decode step at batch {b}", bd) for b, bd in res.get("early_exit_breakdown", {}).items()]
    pb = res.get("prefill_breakdown")
    if pb:
        breakdowns.append((f"prefill step ({pb['prompts']} prompts x {pb['input_len']} tokens, up to "
                           f"{pb['tokens_per_step']} tokens a step)", pb))
    for what, bd in breakdowns:
        lines += ["", f"Kernel time per {what} (torch.profiler, {bd['kernels_per_step']:.0f} kernels per step, "
                      f"{bd['kernel_ms_per_step']:.2f} ms of kernels in {bd['wall_ms_per_step']:.2f} ms of wall time):",
                  "", "| kernel | calls/step | µs/step | share |", "|---|---|---|---|"]
        for k in bd["top"]:
            lines.append(f"| `{k['kernel']}` | {k['calls_per_step']:.0f} | {k['us_per_step']:.0f} | "
                         f"{k['us_per_step'] / 1e3 / bd['kernel_ms_per_step']:.0%} |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bs = list(res["rlt"])
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(bs, [res["rlt"][b]["tok_per_s"] for b in bs], "o-", label="rlt, fixed depth")
    if res["early_exit"]:
        ax.plot(bs, [res["early_exit"][b]["tok_per_s"] for b in bs], "s-", label="rlt, early exit (mean depth 2.5)")
    ax.plot(bs, [res["baseline"][b]["tok_per_s"] for b in bs], "^-", label="PyTorch, one CUDA graph")
    ax.plot(bs, [b / res["rlt"][b]["floor_ms"] * 1e3 for b in bs], "k--", label="roofline floor")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch")
    ax.set_ylabel("decode tok/s")
    ax.set_title("Ouro-1.4B decode on " + res["roofline"]["gpu"])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    bench_main("engine", run, markdown, plot)
