"""Offline benchmarks: `rlt-bench throughput` and `rlt-bench latency` (also used by perf/bench_engine.py).

throughput: decode steady state of `--batch` requests (random token prompts of `--input-len`,
`--output-len` tokens each, ignore_eos): tok/s, ms/step, host vs device time per step. Decode
steps build outputs only for requests that finish, as `LLM.generate` does.
latency: the same measured per request at batch 1 by default: time to first token and time per
output token.
Both take every engine flag (as rlt-serve, speculative shorthand and vLLM names included) and the
per-request sampling and exit flags of rlt-generate (--temperature, --top-p, --exit-threshold,
--min-loops, ...); --uniform-exit-trace replays uniformly drawn depths (the early-exit figures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from typing import Optional

import torch

from ..engine.heap import freeze_heap
from ..errors import ConfigError, RltError
from ..sampling_params import SamplingParams
from .engine_args import add_engine_args, engine_kwargs

WARMUP_OUTPUT_LEN = 8


def _sync(llm) -> None:
    if llm.engine.device.type == "cuda":
        torch.cuda.synchronize(llm.engine.device)


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(16, vocab) for _ in range(length)] for _ in range(n)]


def uniform_trace(ids: list[str], depth: int, output_len: int, seed: int = 0) -> dict:
    """Exit trace with decode depths drawn uniformly from 1..depth (mean (depth + 1) / 2)."""
    rng = random.Random(seed)
    return {rid: [depth] + [rng.randint(1, depth) for _ in range(output_len)] for rid in ids}


def row_trace_ids(n: int) -> list[str]:
    """Trace ids of a benchmark's requests by row (the same in every run: warm-up and measured)."""
    return [f"row-{i}" for i in range(n)]


def decode_benchmark(llm, batch: int, input_len: int, output_len: int, *, prefix: str = "bench", seed: int = 0,
                     params: Optional[SamplingParams] = None, trace_ids: Optional[list[str]] = None) -> dict:
    """Run `batch` requests together; time the decode phase (after every request has its first token).

    params: every request's SamplingParams (default greedy, ignore_eos); max_tokens becomes
    `output_len`. trace_ids: request i replays exit-trace entry trace_ids[i] (default: its
    request id, `prefix`-i).
    """
    eng = llm.engine
    params = dataclasses.replace(params or SamplingParams(temperature=0, ignore_eos=True), max_tokens=output_len)
    prompts = random_prompts(batch, input_len, eng.model_config.vocab_size, seed)
    _sync(llm)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(f"{prefix}-{i}", p, params if trace_ids is None else dataclasses.replace(params, trace_id=trace_ids[i]))
    before = {}  # tokens each request had when the decode phase began
    while len(before) < batch or not all(before.values()):
        for out in eng.step():
            before[out.request_id] = len(out.outputs[0].token_ids)
    _sync(llm)
    t1 = time.perf_counter()
    eng.timings = []
    steps, depths = 0, []
    done = {}
    while eng.has_unfinished_requests():
        # As LLM.generate runs: outputs are built only for requests that finish.
        for out in eng.step(final_only=True):
            done[out.request_id] = out.outputs[0]
        steps += 1
    tokens = sum(len(c.token_ids) - before.get(rid, 0) for rid, c in done.items())
    _sync(llm)
    t2 = time.perf_counter()
    for c in done.values():
        depths += c.exit_depths[1:]
    timings = eng.timings
    eng.timings = None
    decode_s = t2 - t1
    host = [h for h, _ in timings]
    dev = [d for _, d in timings if d is not None]
    return {
        "batch": batch, "input_len": input_len, "output_len": output_len,
        "prefill_s": t1 - t0, "decode_s": decode_s, "decode_steps": steps, "decode_tokens": tokens,
        "tok_per_s": tokens / decode_s if decode_s > 0 else 0.0,
        "ms_per_step": decode_s * 1e3 / max(steps, 1),
        "host_ms_per_step": statistics.median(host) if host else None,
        "device_ms_per_step": statistics.median(dev) if dev else None,
        "mean_depth": sum(depths) / len(depths) if depths else None,
        "sampling_params": {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.init},
    }


def prefill_benchmark(llm, num: int, input_len: int, seed: int = 1) -> dict:
    """Time `num` prompts of `input_len` tokens to their first token (max_tokens=1), after one
    untimed prompt of the same length (kernel compilation for new shapes stays out)."""
    eng = llm.engine
    prompts = random_prompts(num + 1, input_len, eng.model_config.vocab_size, seed)
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    eng.add_request(f"prefill-warm-{seed}", prompts.pop(), params)
    while eng.has_unfinished_requests():
        eng.step()
    _sync(llm)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(f"prefill-{seed}-{i}", p, params)
    while eng.has_unfinished_requests():
        eng.step()
    _sync(llm)
    elapsed = time.perf_counter() - t0
    return {"num": num, "input_len": input_len, "seconds": elapsed, "tok_per_s": num * input_len / elapsed}


def _parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--model", default="ouro-tiny")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--output-json", default=None)
    s = p.add_argument_group("sampling and exit (every request; as rlt-generate)")
    s.add_argument("--temperature", type=float, default=0.0, help="default 0 (greedy)")
    s.add_argument("--top-p", type=float, default=1.0)
    s.add_argument("--top-k", type=int, default=-1)
    s.add_argument("--sampling-seed", type=int, default=None,
                   help="per-request seed (SamplingParams.seed); requests without one are seeded from --seed")
    s.add_argument("--min-loops", type=int, default=None)
    s.add_argument("--max-loops", type=int, default=None)
    s.add_argument("--exit-threshold", type=float, default=1.0, help="< 1: Ouro's adaptive exit (1: fixed depth)")
    s.add_argument("--no-speculative", action="store_true", help="opt every request out of speculative decoding")
    s.add_argument("--uniform-exit-trace", action="store_true",
                   help="replay decode depths drawn uniformly from 1..depth (sets --exit-mode trace)")
    add_engine_args(p)
    return p


def _setup(args) -> tuple:
    """(the LLM, every request's SamplingParams, the requests' trace ids or None) from the parsed flags."""
    from .llm import LLM

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.sampling_seed,
                            ignore_eos=True, min_loops=args.min_loops, max_loops=args.max_loops,
                            exit_threshold=args.exit_threshold, speculative=not args.no_speculative)
    options = engine_kwargs(args)
    if args.uniform_exit_trace:
        if "exit_trace" in options or options.get("exit_mode", "trace") != "trace":
            raise ConfigError("--uniform-exit-trace replays its own trace: leave out --exit-mode and --exit-trace")
        depth = options.get("num_loops") or _model_config(args.model).num_loops
        longest = max(args.output_len, WARMUP_OUTPUT_LEN)
        options.update(exit_mode="trace", exit_trace=uniform_trace(row_trace_ids(args.batch), depth, longest))
    trace_ids = row_trace_ids(args.batch) if args.uniform_exit_trace else None
    llm = LLM(args.model, **options)
    freeze_heap()
    return llm, params, trace_ids


def _model_config(model: str):
    """The model's config without loading weights (a preset's or a checkpoint's config.json)."""
    from ..models.checkpoint import load_config, resolve_model
    from ..models.presets import preset_config

    kind, ref = resolve_model(model)
    return preset_config(ref) if kind == "preset" else load_config(ref)


def throughput_main(argv) -> int:
    p = _parser("rlt-bench throughput")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    try:
        llm, params, ids = _setup(args)
        warm = min(args.batch, 4)
        decode_benchmark(llm, warm, 16, WARMUP_OUTPUT_LEN, prefix="warmup", params=params, trace_ids=ids and ids[:warm])
        result = {"model": args.model, **decode_benchmark(llm, args.batch, args.input_len, args.output_len,
                                                          params=params, trace_ids=ids), "engine": llm.stats()}
    except (RltError, OSError) as exc:
        print(f"rlt-bench throughput: error: {exc}", file=sys.stderr)
        return 2
    _emit(result, args.output_json)
    return 0


def latency_main(argv) -> int:
    p = _parser("rlt-bench latency")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    try:
        llm, params, ids = _setup(args)
        decode_benchmark(llm, args.batch, 16, WARMUP_OUTPUT_LEN, prefix="warmup", params=params, trace_ids=ids)
        runs = [decode_benchmark(llm, args.batch, args.input_len, args.output_len, prefix=f"lat{i}", params=params,
                                 trace_ids=ids) for i in range(args.iters)]
    except (RltError, OSError) as exc:
        print(f"rlt-bench latency: error: {exc}", file=sys.stderr)
        return 2
    result = {
        "model": args.model, "batch": args.batch,
        "ttft_s": statistics.median(r["prefill_s"] for r in runs),
        "tpot_ms": statistics.median(r["ms_per_step"] for r in runs),
        "runs": runs, "engine": llm.stats(),
    }
    _emit(result, args.output_json)
    return 0


def _emit(result: dict, path: Optional[str]) -> None:
    text = json.dumps(result, indent=2, default=str)
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    sys.exit(throughput_main(sys.argv[1:]))
