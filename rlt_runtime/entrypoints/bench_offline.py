"""Offline benchmarks: `rlt-bench throughput` and `rlt-bench latency` (also used by perf/bench_engine.py).

throughput: decode steady state of `--batch` requests (random token prompts of `--input-len`,
`--output-len` tokens each, ignore_eos): tok/s, ms/step, host vs device time per step. Decode
steps build outputs only for requests that finish, as `LLM.generate` does.
latency: the same measured per request at batch 1 by default: time to first token and time per
output token.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from typing import Optional

import torch

from ..sampling_params import SamplingParams
from .engine_args import add_engine_args, engine_kwargs


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


def decode_benchmark(llm, batch: int, input_len: int, output_len: int, *, prefix: str = "bench", seed: int = 0,
                     params: Optional[SamplingParams] = None) -> dict:
    """Run `batch` requests together; time the decode phase (after every request has its first token)."""
    eng = llm.engine
    params = params or SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True)
    prompts = random_prompts(batch, input_len, eng.model_config.vocab_size, seed)
    _sync(llm)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        eng.add_request(f"{prefix}-{i}", p, params)
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
    add_engine_args(p)
    return p


def throughput_main(argv) -> int:
    p = _parser("rlt-bench throughput")
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args(argv)
    from .llm import LLM

    llm = LLM(args.model, **engine_kwargs(args))
    decode_benchmark(llm, min(args.batch, 4), 16, 8, prefix="warmup")
    result = {"model": args.model, **decode_benchmark(llm, args.batch, args.input_len, args.output_len),
              "engine": llm.stats()}
    _emit(result, args.output_json)
    return 0


def latency_main(argv) -> int:
    p = _parser("rlt-bench latency")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    args = p.parse_args(argv)
    from .llm import LLM

    llm = LLM(args.model, **engine_kwargs(args))
    decode_benchmark(llm, args.batch, 16, 8, prefix="warmup")
    runs = [decode_benchmark(llm, args.batch, args.input_len, args.output_len, prefix=f"lat{i}") for i in range(args.iters)]
    result = {
        "model": args.model, "batch": args.batch,
        "ttft_s": statistics.median(r["prefill_s"] for r in runs),
        "tpot_ms": statistics.median(r["ms_per_step"] for r in runs),
        "runs": runs,
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
