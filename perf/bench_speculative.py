"""Self-speculative decoding on one GPU: native fast path vs fixed K = 2, 4 and adaptive K.

    python -m perf.bench_speculative --out out/spec [--quick]

`ouro-1.4b` preset in bf16, prompt 128, output 128, ignore_eos, batch 1, 16, 64, 256. Each
speculative configuration runs at the acceptance the random-init replica really has, and at
synthetic acceptance 0.7 and 0.9 (benchmark aid: each draft accepted with that probability, so
round mechanics are measured at realistic acceptance; those outputs are not the model's).
Reported: end-to-end tok/s including the tail, committed tokens per round (and per request in a
round), requests per round, device time of a round vs a native step, the speed-up by summed device
time alone, and the host syncs per round (counted with CUDA sync debug mode). Engines are built by
`bench_engine.engine` (heap frozen as the CLI and server freeze it, device times recorded).
RLT_SPEC_CONFIGS, RLT_SPEC_BATCHES and RLT_SPEC_ACCEPTANCE narrow a run.
"""

from __future__ import annotations

import os
import tempfile
import time

import torch

from perf.bench_engine import engine, free_engine
from perf.report import bench_main
from perf.roofline import measure
from rlt_runtime.entrypoints.bench_offline import random_prompts
from rlt_runtime.executor.profiling import count_host_syncs
from rlt_runtime.sampling_params import SamplingParams


def end_to_end(llm, batch: int, prefix: str) -> dict:
    eng = llm.engine
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    prompts = random_prompts(batch, 128, eng.model_config.vocab_size, seed=batch)
    eng.timings = []
    before = dict(eng.stats().get("speculative") or {})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(f"{prefix}-{i}", p, params)
    tokens = 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                tokens += len(out.outputs[0].token_ids)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    after = eng.stats().get("speculative") or {}
    dev = sorted(d for _, d in eng.timings if d is not None)
    host_ms = sum(h for h, _ in eng.timings)
    eng.timings = None
    delta = lambda key: after.get(key, 0) - before.get(key, 0)  # noqa: E731 - this run's share of the engine's totals
    rounds, committed, accepted = delta("rounds"), delta("committed"), delta("accepted")
    request_rounds = committed - accepted  # each request in a round commits its accepted drafts + 1
    chosen = {k: n - (before.get("chosen_k") or {}).get(k, 0) for k, n in (after.get("chosen_k") or {}).items()}
    return {"tok_per_s": tokens / elapsed, "seconds": elapsed, "rounds": rounds,
            "committed_per_round": committed / rounds if rounds else None,
            "committed_per_request_round": committed / request_rounds if request_rounds else None,
            "requests_per_round": request_rounds / rounds if rounds else None,
            "median_device_ms_per_step": dev[len(dev) // 2] if dev else None,
            "steps": len(dev), "device_s": sum(dev) / 1e3, "host_s": host_ms / 1e3,
            "chosen_k": {k: n for k, n in chosen.items() if n},
            "round_ms": after.get("round_ms")}  # the adaptive policy's measured round costs so far


def syncs_per_round(llm) -> int:
    eng = llm.engine
    for i in range(4):
        eng.add_request(f"sync-{i}", [5 + i] * 32, SamplingParams(max_tokens=48, temperature=0, ignore_eos=True))
    for _ in range(4):
        eng.step()
    counts = [count_host_syncs(eng.step) for _ in range(4)]
    while eng.has_unfinished_requests():
        eng.step()
    return max(counts)


def preset_checkpoint(name: str) -> str:
    """The preset written once as a bf16 checkpoint, so each engine loads it instead of drawing
    the random weights again."""
    from rlt_runtime.models.checkpoint import save_checkpoint
    from rlt_runtime.models.presets import preset_config, preset_weights

    path = os.path.join(tempfile.gettempdir(), f"rlt-{name}-bf16")
    if not os.path.exists(os.path.join(path, "config.json")):
        cfg = preset_config(name)
        save_checkpoint(path, cfg, preset_weights(cfg, dtype=torch.bfloat16))
    return path


def run(out: str, quick: bool) -> dict:
    batches = [1, 64] if quick else [1, 16, 64, 256]
    if os.environ.get("RLT_SPEC_BATCHES"):  # e.g. "64,256"
        batches = [int(b) for b in os.environ["RLT_SPEC_BATCHES"].split(",")]
    configs = {"fixed2": (2, "fixed"), "fixed4": (4, "fixed"), "adaptive": (4, "adaptive")}
    if quick:
        configs.pop("fixed2")
    only = os.environ.get("RLT_SPEC_CONFIGS")  # e.g. "adaptive": re-measure a subset
    if only:
        configs = {k: v for k, v in configs.items() if k in only.split(",")}
    acceptances = [None, 0.9] if quick else [None, 0.7, 0.9]
    if os.environ.get("RLT_SPEC_ACCEPTANCE"):  # e.g. "0.9" or "measured,0.9"
        acceptances = [None if a == "measured" else float(a) for a in os.environ["RLT_SPEC_ACCEPTANCE"].split(",")]
    res = {"roofline": measure(), "date": time.strftime("%Y-%m-%d"), "native": {}, "spec": {}}
    common = dict(max_num_seqs=max(batches), cuda_graph_sizes=batches)
    model = preset_checkpoint("ouro-1.4b")
    llm, _ = engine(model, **common)
    end_to_end(llm, 2, "warm")
    for b in batches:
        res["native"][b] = end_to_end(llm, b, f"n{b}")
        print("native", b, res["native"][b], flush=True)
    del llm
    free_engine()
    for name, (k, policy) in configs.items():
        for acc in acceptances:
            spec = {"num_speculative_tokens": k, "draft_loops": 2, "draft_policy": policy, "synthetic_acceptance": acc}
            llm, _ = engine(model, speculative_config=spec, **common)
            end_to_end(llm, 2, "warm")
            key = f"{name}@{'measured' if acc is None else acc}"
            res["spec"][key] = {}
            for b in batches:
                r = end_to_end(llm, b, f"{key}{b}")
                nat = res["native"][b]
                r["speedup"] = r["tok_per_s"] / nat["tok_per_s"]
                r["device_speedup"] = nat["device_s"] / r["device_s"]  # the same tokens, by device time alone
                if r["median_device_ms_per_step"] and nat["median_device_ms_per_step"]:
                    r["round_cost_vs_step"] = r["median_device_ms_per_step"] / nat["median_device_ms_per_step"]
                res["spec"][key][b] = r
                print(key, b, r, flush=True)
            res.setdefault("graphs", {})[key] = (llm.stats().get("speculative") or {}).get("graphs")
            if acc is None and name == "fixed4":
                res["syncs_per_round"] = syncs_per_round(llm)
            del llm
            free_engine()
    return res


def markdown(res: dict) -> str:
    roof = res["roofline"]
    batches = list(res["native"])
    lines = [f"Measured {res['date']} on {roof['gpu']} (torch {roof['torch']}, triton {roof['triton']}); "
             f"ouro-1.4b bf16, prompt 128, output 128. Host syncs per speculative round: {res.get('syncs_per_round')}.", "",
             "| config | " + " | ".join(f"batch {b} tok/s (x native) [tokens per request-round, round/step]"
                                    for b in batches) + " |",
             "|---|" + "---|" * len(batches)]
    lines.append("| native | " + " | ".join(f"{res['native'][b]['tok_per_s']:.0f}" for b in batches) + " |")
    for key, per in res["spec"].items():
        cells = []
        for b in batches:
            r = per[b]
            cpr = r.get("committed_per_request_round")
            cost = r.get("round_cost_vs_step")
            cells.append(f"{r['tok_per_s']:.0f} ({r['speedup']:.2f}x) [{'-' if cpr is None else f'{cpr:.2f}'}, "
                         f"{'-' if cost is None else f'{cost:.2f}'}]")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = list(res["native"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, per in res["spec"].items():
        ax.plot(batches, [per[b]["speedup"] for b in batches], "o-", label=key)
    ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch")
    ax.set_ylabel("speedup vs native (end to end)")
    ax.set_title("Self-speculative decoding, Ouro-1.4B, " + res["roofline"]["gpu"])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    bench_main("speculative", run, markdown, plot)
