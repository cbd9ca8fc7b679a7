"""FP8 against bf16 on one GPU, in one run: decode speed and fidelity (JSON + markdown).

    python -m perf.bench_fp8 --out out/fp8 [--parts speed fidelity] [--configs bf16 "w8a8 + KV"]
    python -m perf.bench_fp8 --out out/fp8 --parts speed --batches 256 --graph-sizes 256  # one graph an engine
    python -m perf.bench_fp8 --out /tmp/fp8 --model ouro-tiny --batches 1 2 --output-len 8 --prompts 2  # CPU smoke
    python -m perf.bench_fp8 --out out/fp8-fidelity --parts fidelity  # fidelity alone (a few minutes on the H200)
    python -m perf.bench_fp8 --out out/fp8-sensitivity --parts sensitivity  # the fp32 reference alone (CPU: ~10 min)

Five engines on the `ouro-1.4b` preset (random-init replica): bf16 weights and K/V, FP8 weights
(quantization="fp8", bf16 activations), FP8 weights and K/V (+ kv_cache_dtype="fp8"), and the same
two with FP8 activation rows too (quantization="w8a8_fp8").

* Speed: decode steady state (prompt 128, output 128, greedy, ignore_eos, full depth) at batch 1,
  64, 256 with `bench_offline.decode_benchmark`, beside the roofline floor of `bench_engine.floor_ms`
  with the FP8 bytes: the layers' weights at 1 byte a parameter (embeddings and LM head stay
  bf16) and, with the FP8 cache, K/V at 1 byte an element. Engines are built as
  `bench_engine.engine` builds them (bf16, the heap frozen as `rlt-generate` and `rlt-serve`
  freeze it, each step's device time recorded: `device_ms_per_step`). Each batch runs
  `--repeats` times in the same engine, each run with its own prompts (seed = run); the row is
  the median run, with the fastest and slowest beside it (batch-256 runs of one engine on the
  H200 differed by up to 9%: docs/perf/fp8.md).
* Fidelity against the bf16 engine over a fixed prompt set (seeded random token prompts):
  free-running greedy generation with the Ouro exit gate (exit_threshold 0.5): token agreement by
  position and exit-depth agreement where both engines saw the same tokens (up to and including
  the first differing token); then, teacher-forced on the bf16 continuation (prompt + output fed
  as one prompt, full depth), the mean KL(bf16 || FP8) of the next-token distributions over the
  whole vocabulary and the agreement of their argmax. Fidelity engines run eagerly (the LM head is
  observed from Python) one sequence at a time. A control row, "bf16 (second engine)", measures a
  fresh bf16 engine the same way: batch-invariant kernels make it exactly 0 KL and 100% agreement,
  so any other figure there means the measurement itself is noisy.
* Sensitivity of the model itself (part "sensitivity", any device): the fp32 dense reference
  (`models.dense_reference`), teacher-forced over the first prompts, with its weights rounded to
  bf16 and with the FP8-quantized layer weights widened back, each against the unrounded fp32
  weights. It separates what the format costs on this model from what the engine adds: a
  random-init replica has nearly flat next-token distributions, so bf16 rounding alone already
  moves its argmax, and the FP8 figures above are expected to be about as far from bf16 as the
  reference's FP8 row is from fp32.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

from perf.bench_engine import free_engine
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.entrypoints.bench_offline import decode_benchmark, random_prompts
from rlt_runtime.models.fp8_weights import FP8_QUANTIZATIONS

CONFIGS = {
    "bf16": {},
    "fp8 weights": {"quantization": "fp8"},
    "fp8 weights + KV": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
    "w8a8": {"quantization": "w8a8_fp8"},
    "w8a8 + KV": {"quantization": "w8a8_fp8", "kv_cache_dtype": "fp8"},
}
BATCHES = [1, 64, 256]
EXIT_THRESHOLD = 0.5
CONTROL = "bf16 (second engine)"  # a fresh bf16 engine against the reference: the measurement's noise
PARTS = ("speed", "fidelity", "sensitivity")
SENSITIVITY_PROMPTS = 2  # the reference runs token by token


def _reads(cfg, name: str, depth: int) -> int:
    """How many times one decode step reads weight `name` (loops re-read their layers)."""
    if cfg.family == "ouro":
        return depth if ".layers." in name else 1
    return depth if ".core_block." in name or "adapter" in name else 1


def _quantized(cfg, name: str, shape) -> bool:
    """Whether the FP8 quantizations store this checkpoint weight as FP8 (models/fp8_weights.py)."""
    if len(shape) != 2:
        return False
    if cfg.family == "ouro":
        return ".layers." in name
    return any(part in name for part in (".prelude.", ".core_block.", ".coda.", "adapter"))


def fp8_weight_bytes_per_step(cfg, depth: int) -> int:
    """Weight bytes of one full-depth decode step with FP8 layer weights (1 byte a parameter)."""
    from perf.bench_engine import weight_bytes_per_step
    from rlt_runtime.models.configs import hf_weight_shapes

    saved = sum(math.prod(shape) * _reads(cfg, name, depth)
                for name, shape in hf_weight_shapes(cfg).items() if _quantized(cfg, name, shape))
    return weight_bytes_per_step(cfg, depth) - saved


REPEATS = 3


def median_run(runs: list[dict]) -> dict:
    """The median of `decode_benchmark` results by ms_per_step (the slower middle one of an even
    count), with every run's ms_per_step and the spread: ms_per_step_min / _max."""
    ordered = sorted(runs, key=lambda r: r["ms_per_step"])
    mid = dict(ordered[len(ordered) // 2])
    mid.update(runs_ms_per_step=[r["ms_per_step"] for r in runs], ms_per_step_min=ordered[0]["ms_per_step"],
               ms_per_step_max=ordered[-1]["ms_per_step"])
    return mid


def speed(model, options, batches, input_len, output_len, roof, repeats: int = REPEATS, graph_sizes=None) -> dict:
    """Each batch's decode steps on an engine of `options` (graph_sizes: its decode graphs'
    `cuda_graph_sizes`; None, the engine's ladder)."""
    from perf.bench_engine import engine, floor_ms

    llm, _ = engine(model, max_num_seqs=max(batches), cuda_graph_sizes=graph_sizes, **options)
    cfg, depth = llm.engine.model_config, llm.engine.depth
    decode_benchmark(llm, min(4, max(batches)), 32, 8, prefix="warm")
    out = {"block_bytes": llm.engine.memory_plan.block_bytes, "num_blocks": llm.engine.memory_plan.num_blocks,
           "vocab_size": cfg.vocab_size}
    wbytes = fp8_weight_bytes_per_step(cfg, depth) if options.get("quantization") in FP8_QUANTIZATIONS else None
    kv_elem = 1 if options.get("kv_cache_dtype") == "fp8" else 2
    for b in batches:
        r = median_run([decode_benchmark(llm, b, input_len, output_len, prefix=f"d{b}r{i}", seed=i)
                        for i in range(repeats)])
        if roof is not None:
            r["floor_ms"] = floor_ms(cfg, depth, b, roof, ctx=input_len + output_len // 2, weight_bytes=wbytes,
                                     kv_elem_bytes=kv_elem)
            r["frac_floor"] = r["floor_ms"] / r["ms_per_step"]
        out[b] = r
        print(options, b, {k: r.get(k) for k in ("tok_per_s", "ms_per_step", "ms_per_step_min", "ms_per_step_max",
                                                  "floor_ms")}, flush=True)
    del llm
    free_engine()
    return out


def _teacher_forced_logprobs(llm, seq: list[int]) -> torch.Tensor:
    """fp32 log-softmax [len(seq) - 1, vocab] of the next-token logits at positions 0..len-2 of
    `seq`, fed as one prompt (full depth), taken from the LM-head calls of the prompt's
    log-probability pass (the step's first LM-head call samples the next token)."""
    model = llm.engine.executor.worker.model
    calls = []
    head = type(model).logits

    def record(h, ops, active=None, out=None):
        res = head(model, h, ops, active, out)
        calls.append(torch.log_softmax(res.float(), dim=-1).cpu())
        return res

    model.logits = record
    try:
        llm.generate([seq], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=0),
                     use_tqdm=False)
    finally:
        del model.logits
    rows = torch.cat(calls[1:])  # after the step's sampling call (one prefill chunk: the sequence is short)
    if rows.shape[0] != len(seq) - 1:
        raise RuntimeError(f"expected {len(seq) - 1} prompt rows from the LM head, saw {rows.shape[0]}")
    return rows


def fidelity(model, options, prompts, output_len, dtype, reference=None) -> dict:
    """Free-running greedy outputs and teacher-forced log-probabilities of one engine; with the
    bf16 engine's `reference`, the agreement and KL figures against it."""
    llm = LLM(model, dtype=dtype, execution_mode="eager", max_num_seqs=len(prompts), **options)
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True, exit_threshold=EXIT_THRESHOLD)
    outs = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
    run = {"tokens": [list(o.token_ids) for o in outs], "depths": [list(o.exit_depths) for o in outs]}
    seqs = [p + t for p, t in zip(prompts, (reference or run)["tokens"])]
    run["logprobs"] = [_teacher_forced_logprobs(llm, s)[len(p) - 1:] for s, p in zip(seqs, prompts)]
    del llm
    free_engine()
    if reference is None:
        return run
    same_tok = total = same_depth = depth_total = 0
    kls, argmax_same, rows = [], 0, 0
    for i in range(len(prompts)):
        ref_t, t = reference["tokens"][i], run["tokens"][i]
        same_tok += sum(a == b for a, b in zip(ref_t, t))
        total += len(ref_t)
        diverge = next((j for j, (a, b) in enumerate(zip(ref_t, t)) if a != b), len(ref_t) - 1)
        pairs = list(zip(reference["depths"][i], run["depths"][i]))[: diverge + 1]
        same_depth += sum(a == b for a, b in pairs)
        depth_total += len(pairs)
        p, q = reference["logprobs"][i], run["logprobs"][i]
        kls.append((p.exp() * (p - q)).sum(-1))
        argmax_same += int((p.argmax(-1) == q.argmax(-1)).sum())
        rows += p.shape[0]
    kl = torch.cat(kls)
    return {"greedy_agreement": same_tok / total, "exit_depth_agreement": same_depth / max(depth_total, 1),
            "exit_depth_positions": depth_total, "teacher_forced_argmax_agreement": argmax_same / rows,
            "mean_kl": float(kl.mean()), "max_kl": float(kl.max()), "positions": rows}


def _model_weights(model: str):
    """(config, {hf name: fp32 tensor on the CPU}) of a preset or checkpoint directory."""
    from rlt_runtime.models.checkpoint import iter_checkpoint, load_config, resolve_model
    from rlt_runtime.models.presets import preset_config, preset_weights

    kind, where = resolve_model(model)
    if kind == "preset":
        cfg = preset_config(where)
        return cfg, dict(preset_weights(cfg))
    cfg = load_config(where)
    return cfg, dict(iter_checkpoint(where, cfg, dtype=torch.float32))


def sensitivity(model, prompts, device) -> dict:
    """Teacher-forced fp32 dense reference with bf16-rounded and with FP8 (quantized, widened) layer
    weights, each against the fp32 weights: mean/max KL and argmax agreement over every prompt position."""
    from rlt_kernels.fp8 import dequantize_weight_fp8, quantize_weight_fp8
    from rlt_runtime.models.dense_reference import reference_generate

    cfg, weights = _model_weights(model)

    def logprobs(ws):
        ws = {n: t.to(device) for n, t in ws.items()}
        rows = [reference_generate(cfg, ws, p, 1, dtype=torch.float32).prompt_logits for p in prompts]
        return torch.log_softmax(torch.stack([r for rs in rows for r in rs]).float(), dim=-1).cpu()

    def fp8(name, t):
        return dequantize_weight_fp8(*quantize_weight_fp8(t)) if _quantized(cfg, name, t.shape) else t

    variants = {"bf16 weights": {n: t.to(torch.bfloat16).float() for n, t in weights.items()},
                "fp8 weights": {n: fp8(n, t) for n, t in weights.items()}}
    ref = logprobs(weights)
    out = {}
    for name, ws in variants.items():
        lp = logprobs(ws)
        kl = (ref.exp() * (ref - lp)).sum(-1)
        out[name] = {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()), "positions": ref.shape[0],
                     "argmax_agreement": float((ref.argmax(-1) == lp.argmax(-1)).float().mean())}
        print("sensitivity", name, out[name], flush=True)
    return out


def run(args) -> dict:
    on_cuda = torch.cuda.is_available()
    dtype = "bfloat16"
    roof = None
    if on_cuda:
        from perf.roofline import measure

        roof = measure()
        print("roofline", roof, flush=True)
    res = {"model": args.model, "date": time.strftime("%Y-%m-%d"), "roofline": roof, "dtype": dtype,
           "input_len": args.input_len, "output_len": args.output_len, "repeats": args.repeats,
           "graph_sizes": args.graph_sizes, "speed": {}, "fidelity": {},
           "sensitivity": {}}
    configs = {name: CONFIGS[name] for name in args.configs}
    if "speed" in args.parts:
        for name, options in configs.items():
            res["speed"][name] = speed(args.model, options, args.batches, args.input_len, args.output_len, roof,
                                       args.repeats, args.graph_sizes)
    if "fidelity" in args.parts:
        prompts = random_prompts(args.prompts, args.fidelity_prompt_len, vocab_size(args.model), seed=11)
        reference = fidelity(args.model, CONFIGS["bf16"], prompts, args.fidelity_output_len, dtype)
        quantized = [(n, o) for n, o in configs.items() if n != "bf16"]
        for name, options in [(CONTROL, CONFIGS["bf16"]), *quantized]:
            res["fidelity"][name] = fidelity(args.model, options, prompts, args.fidelity_output_len, dtype, reference)
            print("fidelity", name, {k: v for k, v in res["fidelity"][name].items() if k != "logprobs"}, flush=True)
    if "sensitivity" in args.parts:
        prompts = random_prompts(SENSITIVITY_PROMPTS, args.fidelity_prompt_len, vocab_size(args.model), seed=11)
        res["sensitivity"] = sensitivity(args.model, prompts, "cuda" if on_cuda else "cpu")
    return res


def vocab_size(model: str) -> int:
    """The vocabulary of a preset or checkpoint directory (read from its config, no weights)."""
    from rlt_runtime.models.checkpoint import load_config, resolve_model
    from rlt_runtime.models.presets import preset_config

    kind, where = resolve_model(model)
    return (preset_config(where) if kind == "preset" else load_config(where)).vocab_size


def markdown(res: dict) -> str:
    roof = res["roofline"]
    head = (f"Measured {res['date']} on {roof['gpu']} (torch {roof['torch']}, triton {roof['triton']}): copy "
            f"{roof['copy_gbps']:.0f} GB/s, bf16 GEMM {roof['gemm_tflops']:.0f} TFLOP/s." if roof else
            f"Measured {res['date']} without a GPU (no roofline floors).")
    lines = [f"# FP8 on {res['model']}", "", head, ""]
    if res["speed"]:
        lines += [f"Decode steady state, prompt {res['input_len']}, output {res['output_len']}, greedy, full depth; "
                  "floors with FP8 bytes (layer weights 1 byte a parameter; FP8 cache 1 byte a K/V element).", "",
                  f"Each row is the median of {res.get('repeats', 1)} runs (own prompts each); ms/step range: the "
                  "fastest and slowest run.", "",
                  "| engine | batch | tok/s | ms/step | ms/step range | floor ms | of floor | vs bf16 |",
                  "|---|---|---|---|---|---|---|---|"]
    base = res["speed"].get("bf16")
    for name, runs in res["speed"].items():
        for b, r in runs.items():
            if not isinstance(r, dict):
                continue
            floor = f"{r['floor_ms']:.2f}" if "floor_ms" in r else "-"
            frac = f"{r['frac_floor']:.0%}" if "frac_floor" in r else "-"
            ratio = f"{r['tok_per_s'] / base[b]['tok_per_s']:.2f}x" if base else "-"
            spread = f"{r['ms_per_step_min']:.2f}-{r['ms_per_step_max']:.2f}" if "ms_per_step_min" in r else "-"
            lines.append(f"| {name} | {b} | {r['tok_per_s']:.0f} | {r['ms_per_step']:.2f} | {spread} | {floor} | {frac} | "
                         f"{ratio} |")
    if res["fidelity"]:
        lines += _fidelity_lines(res)
    if res.get("sensitivity"):
        sens = res["sensitivity"]
        lines += ["", f"Sensitivity of the model: fp32 dense reference, teacher-forced over "
                  f"{next(iter(sens.values()))['positions']} positions, against its fp32 weights.", "",
                  "| weights | mean KL | max KL | argmax agreement |", "|---|---|---|---|"]
        for name, f in sens.items():
            lines.append(f"| {name} | {f['mean_kl']:.2e} | {f['max_kl']:.2e} | {f['argmax_agreement']:.1%} |")
    return "\n".join(lines) + "\n"


def _fidelity_lines(res: dict) -> list[str]:
    lines = ["", f"Fidelity against bf16 over {next(iter(res['fidelity'].values()))['positions']} "
              f"teacher-forced positions (exit_threshold {EXIT_THRESHOLD} for the free-running figures).", "",
              "| engine | mean KL | max KL | argmax agreement (teacher-forced) | greedy agreement | exit-depth agreement |",
              "|---|---|---|---|---|---|"]
    for name, f in res["fidelity"].items():
        lines.append(f"| {name} | {f['mean_kl']:.2e} | {f['max_kl']:.2e} | {f['teacher_forced_argmax_agreement']:.1%} | "
                     f"{f['greedy_agreement']:.1%} | {f['exit_depth_agreement']:.1%} |")
    return lines


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="out/fp8")
    ap.add_argument("--model", default="ouro-1.4b", help="preset or checkpoint (ouro-tiny for a CPU smoke run)")
    ap.add_argument("--batches", type=int, nargs="+", default=BATCHES)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=REPEATS, help="decode runs per batch (speed); the median is reported")
    ap.add_argument("--prompts", type=int, default=16, help="fidelity prompts")
    ap.add_argument("--fidelity-prompt-len", type=int, default=32)
    ap.add_argument("--fidelity-output-len", type=int, default=32)
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=["speed", "fidelity"], help="what to measure")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS), help="engines to run")
    ap.add_argument("--graph-sizes", type=int, nargs="+", default=None,
                    help="the speed engines' decode graph sizes (default: the engine's ladder); the timed batches' "
                         "own sizes capture only the graphs those steps replay, for a short device budget")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    os.makedirs(args.out, exist_ok=True)
    res = run(args)
    for f in res["fidelity"].values():
        f.pop("logprobs", None)
    with open(os.path.join(args.out, "fp8.json"), "w") as f:
        json.dump(res, f, indent=2, default=str)
    md = markdown(res)
    with open(os.path.join(args.out, "fp8.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
