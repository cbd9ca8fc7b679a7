"""rlt-bench: benchmarks. `serve` is an async OpenAI-compatible load generator; `throughput` and
`latency` (offline, in-process) live in rlt_runtime/entrypoints/bench_offline.py.

    rlt-bench serve --base-url http://127.0.0.1:8000 --num-prompts 500 --random-input-len 512 \\
        --random-output-len 128 --request-rate 8 --result-file results.json
    rlt-bench serve --endpoint /v1/chat/completions --dataset-name sharegpt --dataset-path sg.json
    rlt-bench throughput ... / rlt-bench latency ...   (their own flags; see --help)

`serve` streams every request (stream_options.include_usage) and measures, per request, TTFT
(send to first token chunk), ITL (gaps between token chunks), TPOT ((E2E - TTFT) / (output
tokens - 1)) and E2E; token counts come from the server's usage chunk. Prompts are built with the
server's own /tokenize and /detokenize, so the client needs no tokenizer: random prompts are
token-id lists drawn from the ids of ordinary text (sent as ids to /v1/completions, as their
decoded text to chat), ShareGPT prompts are the first human turn of each conversation.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

import numpy as np

SUBCOMMANDS = ("serve", "throughput", "latency")
# Ordinary text whose token ids make up random prompts (any tokenizer splits it into common tokens).
VOCAB_TEXT = ("the quick brown fox jumps over the lazy dog while five wizards quietly mix gin and vodka; "
              "THE QUICK BROWN FOX 0123456789 looping models think deeper, exit earlier, and share one cache. "
              "Pack my box with jugs of liquid, answer questions, write code, plan trips, explain ideas!")
GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2e": "e2el", "e2el": "e2el"}


@dataclass
class BenchRequest:
    prompt: object  # token ids (completions) or text (chat / text prompts)
    prompt_len: int
    output_len: int


@dataclass
class RequestResult:
    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    e2el: float = 0.0
    itl: list = field(default_factory=list)

    @property
    def tpot(self) -> Optional[float]:
        return (self.e2el - self.ttft) / (self.output_len - 1) if self.output_len > 1 else None


# ---- datasets --------------------------------------------------------------------------------------

class ServerInfo:
    """What the benchmark asks the server once: model, context, tokenizer round trips."""

    def __init__(self, client, model: Optional[str]):
        self.client = client
        self.model = model
        self.max_model_len = 0

    async def load(self) -> None:
        resp = await self.client.get("/v1/models")
        resp.raise_for_status()
        cards = resp.json()["data"]
        card = next((c for c in cards if c["id"] == self.model), None) if self.model else cards[0]
        if card is None:
            raise SystemExit(f"rlt-bench: error: the server does not serve {self.model!r}; it serves "
                             f"{[c['id'] for c in cards]}")
        self.model = card["id"]
        self.max_model_len = int(card.get("max_model_len") or 0)

    async def tokenize(self, text: str) -> Optional[list[int]]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        resp = await self.client.post("/tokenize", json=body)
        return resp.json()["tokens"] if resp.status_code == 200 else None

    async def detokenize(self, ids: list[int]) -> str:
        resp = await self.client.post("/detokenize", json={"model": self.model, "tokens": ids})
        if resp.status_code != 200:
            raise SystemExit(f"rlt-bench: error: chat prompts need the server's /detokenize: {resp.text[:200]}")
        return resp.json()["prompt"]


def _lengths(rng: random.Random, mean: int, ratio: float, n: int, floor: int) -> list[int]:
    lo, hi = max(floor, int(mean * (1 - ratio))), max(floor, int(mean * (1 + ratio)))
    return [rng.randint(lo, hi) for _ in range(n)]


async def random_dataset(info: ServerInfo, args, rng: random.Random, chat: bool) -> list[BenchRequest]:
    pool = sorted(set(await info.tokenize(VOCAB_TEXT) or ())) or list(range(1, 256))
    n = args.num_prompts + args.num_warmups
    ins = _lengths(rng, args.random_input_len, args.random_range_ratio, n, 1)
    outs = _lengths(rng, args.random_output_len, args.random_range_ratio, n, 1)
    out = []
    for in_len, out_len in zip(ins, outs):
        ids = [rng.choice(pool) for _ in range(in_len)]
        out.append(BenchRequest(await info.detokenize(ids) if chat else ids, in_len, out_len))
    return out


async def sharegpt_dataset(info: ServerInfo, args, rng: random.Random) -> list[BenchRequest]:
    with open(args.dataset_path, encoding="utf-8") as f:
        data = json.load(f)
    pairs = [(d["conversations"][0]["value"], d["conversations"][1]["value"]) for d in data
             if isinstance(d, dict) and len(d.get("conversations") or ()) >= 2]
    rng.shuffle(pairs)
    limit = info.max_model_len or 2048
    want, out = args.num_prompts + args.num_warmups, []
    for prompt, completion in pairs:
        if len(out) == want:
            break
        p_ids = await info.tokenize(prompt)
        if p_ids is None:
            raise SystemExit("rlt-bench: error: the ShareGPT dataset needs the server's /tokenize "
                             "(a model with a tokenizer)")
        fixed = args.sharegpt_output_len
        out_len = fixed or len(await info.tokenize(completion) or ())
        too_short = len(p_ids) < 4 or (not fixed and out_len < 4)
        if too_short or len(p_ids) > 1024 or len(p_ids) + out_len > min(2048, limit):
            continue
        out.append(BenchRequest(prompt, len(p_ids), out_len))
    if len(out) < want:
        raise SystemExit(f"rlt-bench: error: {args.dataset_path} has only {len(out)} usable conversations, need {want}")
    return out


# ---- one request -----------------------------------------------------------------------------------

def _payload(args, model: str, req: BenchRequest, chat: bool) -> dict:
    body = {"model": model, "temperature": args.temperature, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body.update(messages=[{"role": "user", "content": req.prompt}], max_completion_tokens=req.output_len)
    else:
        body.update(prompt=req.prompt, max_tokens=req.output_len)
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update({name: getattr(args, f"body_{name}") for _, _, name in REQUEST_FLAGS
                 if getattr(args, f"body_{name}") is not None})
    body.update(args.extra_body)
    return body


async def send_request(client, endpoint: str, body: dict, req: BenchRequest, chat: bool) -> RequestResult:
    result = RequestResult(prompt_len=req.prompt_len)
    chunks = 0
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", endpoint, json=body) as resp:
            if resp.status_code != 200:
                result.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    result.success = True
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = event["error"].get("message", "error event")
                    break
                usage = event.get("usage")
                if usage:
                    result.prompt_len = usage["prompt_tokens"]
                    result.output_len = usage["completion_tokens"]
                choices = event.get("choices") or ()
                if not choices or (chat and "role" in choices[0].get("delta", {})):
                    continue  # the usage chunk, or chat's opening role chunk (sent before any token)
                now = time.perf_counter()
                if chunks == 0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
                chunks += 1
    except Exception as exc:  # noqa: BLE001 - a failed request is a data point, not a crash
        result.error = f"{type(exc).__name__}: {exc}"
    result.e2el = time.perf_counter() - start
    if result.success and not result.output_len:
        result.output_len = chunks
    if result.success and chunks == 0:
        result.success, result.error = False, "no tokens were streamed"
    return result


# ---- the run ---------------------------------------------------------------------------------------

async def _arrivals(n: int, rate: float, burstiness: float, rng: random.Random):
    """Yields 0..n-1 at Poisson (burstiness 1) or gamma-distributed gaps; all at once for rate inf."""
    for i in range(n):
        yield i
        if math.isfinite(rate) and i + 1 < n:
            await asyncio.sleep(rng.gammavariate(burstiness, 1.0 / (rate * burstiness)))


async def run_serve(args) -> dict:
    import httpx

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    chat = args.endpoint.rstrip("/").endswith("chat/completions")
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args.max_concurrency or 1024)
    async with httpx.AsyncClient(base_url=args.base_url, headers=headers, timeout=args.timeout, limits=limits) as client:
        info = ServerInfo(client, args.model)
        await info.load()
        if args.dataset_name == "random":
            dataset = await random_dataset(info, args, rng, chat)
        else:
            dataset = await sharegpt_dataset(info, args, rng)
        warmups, requests = dataset[:args.num_warmups], dataset[args.num_warmups:]
        for req in warmups:
            await send_request(client, args.endpoint, _payload(args, info.model, req, chat), req, chat)

        gate = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        running = peak = 0

        async def limited(req: BenchRequest) -> RequestResult:
            nonlocal running, peak
            if gate is not None:
                await gate.acquire()
            running += 1
            peak = max(peak, running)
            try:
                return await send_request(client, args.endpoint, _payload(args, info.model, req, chat), req, chat)
            finally:
                running -= 1
                if gate is not None:
                    gate.release()

        start = time.perf_counter()
        tasks = []
        async for i in _arrivals(len(requests), args.request_rate, args.burstiness, rng):
            tasks.append(asyncio.create_task(limited(requests[i])))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    report = summarize(results, duration, args.percentiles, args.goodput)
    report.update(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"), backend="openai-chat" if chat else "openai",
        base_url=args.base_url, endpoint=args.endpoint, model=info.model, dataset=args.dataset_name,
        num_prompts=len(requests), num_warmups=len(warmups), request_rate=args.request_rate if math.isfinite(
            args.request_rate) else "inf", burstiness=args.burstiness, max_concurrency=args.max_concurrency,
        peak_concurrency=peak, extra_body=args.extra_body,
    )
    return report


def _stats(values: list[float], name: str, percentiles: list[float]) -> dict:
    """Mean, median, std and percentiles (linear interpolation) in ms; zeros when there are no values."""
    ms = np.asarray(values, dtype=np.float64) * 1000.0
    out = {f"mean_{name}_ms": 0.0, f"median_{name}_ms": 0.0, f"std_{name}_ms": 0.0}
    out.update({f"p{_pct_name(p)}_{name}_ms": 0.0 for p in percentiles})
    if ms.size:
        out[f"mean_{name}_ms"] = float(ms.mean())
        out[f"median_{name}_ms"] = float(np.median(ms))
        out[f"std_{name}_ms"] = float(ms.std())
        for p in percentiles:
            out[f"p{_pct_name(p)}_{name}_ms"] = float(np.percentile(ms, p))
    return out


def _pct_name(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def summarize(results: list[RequestResult], duration: float, percentiles: list[float], slos: dict) -> dict:
    """Aggregate metrics (vLLM bench names) plus per-request arrays."""
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    good = [r for r in ok if _meets(r, slos)]
    report = {
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        "request_goodput": len(good) / duration if slos and duration else None,
        "goodput_slos_ms": dict(slos) or None,
        "percentiles": percentiles,
    }
    report.update(_stats([r.ttft for r in ok], "ttft", percentiles))
    report.update(_stats([r.tpot for r in ok if r.tpot is not None], "tpot", percentiles))
    report.update(_stats([x for r in ok for x in r.itl], "itl", percentiles))
    report.update(_stats([r.e2el for r in ok], "e2el", percentiles))
    report.update(
        input_lens=[r.prompt_len for r in results], output_lens=[r.output_len for r in results],
        ttfts=[r.ttft for r in results], e2els=[r.e2el for r in results], itls=[r.itl for r in results],
        errors=[r.error for r in results],
    )
    return report


def _meets(r: RequestResult, slos: dict) -> bool:
    values = {"ttft": r.ttft, "tpot": r.tpot if r.tpot is not None else 0.0, "e2el": r.e2el}
    return all(values[key] * 1000.0 <= limit for key, limit in slos.items())


# ---- command line ----------------------------------------------------------------------------------

def _goodput(items: Optional[list[str]]) -> dict:
    slos = {}
    for item in items or ():
        key, _, value = item.partition(":")
        if key not in GOODPUT_KEYS or not value:
            raise argparse.ArgumentTypeError(f"--goodput takes KEY:MS with KEY in ttft, tpot, e2e; got {item!r}")
        try:
            slos[GOODPUT_KEYS[key]] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--goodput {item!r}: {value!r} is not a number of milliseconds") from None
    return slos


# Sampling and loop fields sent with every request when given (rlt-generate's flag names).
REQUEST_FLAGS = (("--top-p", float, "top_p"), ("--top-k", int, "top_k"), ("--sampling-seed", int, "seed"),
                 ("--exit-threshold", float, "exit_threshold"), ("--min-loops", int, "min_loops"),
                 ("--max-loops", int, "max_loops"))


def build_serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlt-bench serve", description="Load-test an OpenAI-compatible server.")
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--endpoint", default="/v1/completions", choices=("/v1/completions", "/v1/chat/completions"))
    p.add_argument("--model", default=None, help="model id (default: the server's first model)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--dataset-name", default="random", choices=("random", "sharegpt"))
    p.add_argument("--dataset-path", default=None, help="ShareGPT-format JSON file (dataset sharegpt)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--num-warmups", type=int, default=2, help="requests sent first and left out of the results")
    p.add_argument("--random-input-len", type=int, default=512)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths are drawn uniformly from [len * (1 - r), len * (1 + r)]")
    p.add_argument("--sharegpt-output-len", type=int, default=None, help="override the conversations' output lengths")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (default inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrival gaps (1 = Poisson)")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    for flag, kind, field_name in REQUEST_FLAGS:
        p.add_argument(flag, type=kind, default=None, dest=f"body_{field_name}",
                       help=f"request field {field_name} (default: the server's)")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly the requested output lengths")
    p.add_argument("--extra-body", type=json.loads, default={},
                   help='JSON merged into every request, e.g. \'{"speculative": false}\'')
    p.add_argument("--goodput", nargs="+", default=None, metavar="KEY:MS", help="SLOs, e.g. ttft:500 tpot:50 e2e:10000")
    p.add_argument("--percentiles", default="50,90,99", help="comma-separated percentiles to report")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-file", default=None, help="write the JSON results here")
    return p


def _check_args(p: argparse.ArgumentParser, args) -> None:
    if args.dataset_name == "sharegpt" and not args.dataset_path:
        p.error("--dataset-name sharegpt needs --dataset-path")
    for name in ("num_prompts", "random_input_len", "random_output_len"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_warmups < 0:
        p.error("--num-warmups must be >= 0")
    if not 0.0 <= args.random_range_ratio < 1.0:
        p.error("--random-range-ratio must be in [0, 1)")
    if not args.request_rate > 0 or args.burstiness <= 0:
        p.error("--request-rate and --burstiness must be > 0")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        p.error("--max-concurrency must be >= 1")
    if not isinstance(args.extra_body, dict):
        p.error("--extra-body must be a JSON object")
    try:
        args.goodput = _goodput(args.goodput)
        args.percentiles = [float(x) for x in args.percentiles.split(",") if x.strip()]
    except (argparse.ArgumentTypeError, ValueError) as exc:
        p.error(str(exc))
    if any(not 0 < x < 100 for x in args.percentiles):
        p.error("--percentiles must be in (0, 100)")


def print_report(report: dict) -> None:
    rows = [("Successful requests", report["completed"]), ("Failed requests", report["failed"]),
            ("Benchmark duration (s)", f"{report['duration']:.2f}"),
            ("Total input tokens", report["total_input_tokens"]),
            ("Total generated tokens", report["total_output_tokens"]),
            ("Request throughput (req/s)", f"{report['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{report['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{report['total_token_throughput']:.2f}")]
    if report["request_goodput"] is not None:
        rows.append(("Request goodput (req/s)", f"{report['request_goodput']:.2f}"))
    for name, title in (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency")):
        rows.append((f"Mean {title} (ms)", f"{report[f'mean_{name}_ms']:.2f}"))
        rows.append((f"Median {title} (ms)", f"{report[f'median_{name}_ms']:.2f}"))
        for p in report["percentiles"]:
            rows.append((f"P{_pct_name(p)} {title} (ms)", f"{report[f'p{_pct_name(p)}_{name}_ms']:.2f}"))
    width = max(len(k) for k, _ in rows) + 2
    print("=" * (width + 14))
    for key, value in rows:
        print(f"{key + ':':<{width}}{value:>14}")
    print("=" * (width + 14))
    errors = [e for e in report["errors"] if e]
    if errors:
        print(f"first error: {errors[0]}")


def serve_main(argv: list[str]) -> int:
    p = build_serve_parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    import httpx

    try:
        report = asyncio.run(run_serve(args))
    except httpx.HTTPError as exc:
        print(f"rlt-bench: error: {args.base_url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print_report(report)
    if args.result_file:
        with open(args.result_file, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    return 0 if report["completed"] else 1


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: rlt-bench {{{','.join(SUBCOMMANDS)}}} [options]   (rlt-bench <subcommand> --help)")
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve_main(rest)
    if command in ("throughput", "latency"):
        try:
            offline = importlib.import_module("rlt_runtime.entrypoints.bench_offline")
        except ModuleNotFoundError as exc:
            if exc.name != "rlt_runtime.entrypoints.bench_offline":
                raise
            print(f"rlt-bench: error: '{command}' is not available (rlt_runtime/entrypoints/bench_offline.py is missing)",
                  file=sys.stderr)
            return 2
        return int(getattr(offline, f"{command}_main")(rest) or 0)
    print(f"rlt-bench: error: unknown subcommand {command!r}; choose from {', '.join(SUBCOMMANDS)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
