"""Serving curve on one GPU: `rlt-bench serve` against `rlt-serve --model ouro-1.4b`.

    python -m perf.bench_serving --out out/serving [--quick]

Random requests (input 512, output 128, ignore_eos) at increasing request rates up to
saturation, native and with speculation; one JSON per point plus a table and a plot of
throughput against TTFT / TPOT. RLT_SERVING_OUTPUT_LEN sets the output length (e.g. 2000: long
streams, where host work that grew with output length would show as a rising TPOT).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx

from perf.report import bench_main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    cmd = [sys.executable, "-m", "rlt_runtime.entrypoints.server.cli", "--model", "ouro-1.4b", "--port", str(port),
           "--dtype", "bfloat16", "--max-num-seqs", "256"] + extra
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError("rlt-serve exited: " + proc.stderr.read()[-2000:])
        time.sleep(1)
    raise RuntimeError("rlt-serve did not become healthy")


def _output_len() -> int:
    return int(os.environ.get("RLT_SERVING_OUTPUT_LEN", "128"))


def _bench(url: str, rate: str, num: int, path: str) -> dict:
    cmd = [sys.executable, "-m", "rlt_runtime.entrypoints.bench", "serve", "--base-url", url, "--num-prompts", str(num),
           "--random-input-len", "512", "--random-output-len", str(_output_len()), "--ignore-eos", "--temperature", "0",
           "--request-rate", rate, "--num-warmups", "4", "--result-file", path]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


def run(out: str, quick: bool) -> dict:
    rates = ["4", "16", "inf"] if quick else ["16", "32", "64", "inf"]
    rates = os.environ.get("RLT_SERVING_RATES", ",".join(rates)).split(",")  # e.g. "16,32,inf"
    num = 100 if quick else 500
    res = {"date": time.strftime("%Y-%m-%d"), "num_prompts": num, "output_len": _output_len(), "points": {}}
    modes = [("native", []), ("speculative", ["--speculative-tokens", "4", "--draft-policy", "adaptive"])]
    only = os.environ.get("RLT_SERVING_MODES")  # e.g. "speculative": measure a subset
    for name, extra in [m for m in modes if not only or m[0] in only.split(",")]:
        proc, url = _serve(extra)
        try:
            for rate in rates:
                r = _bench(url, rate, num, os.path.join(out, f"serve-{name}-{rate}.json"))
                res["points"].setdefault(name, {})[rate] = r
                print(name, rate, {k: r.get(k) for k in ("request_throughput", "output_throughput")}, flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    return res


def markdown(res: dict) -> str:
    lines = [f"Measured {res['date']}; {res['num_prompts']} random requests (input 512, output "
             f"{res.get('output_len', 128)}) per point.", "",
             "| mode | request rate | req/s | output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | ITL p50 (ms) | E2E p50 (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for mode, pts in res["points"].items():
        for rate, r in pts.items():
            cells = [r.get(k) for k in ("request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms",
                                        "median_itl_ms", "median_e2el_ms")]
            lines.append(f"| {mode} | {rate} | " + " | ".join("n/a" if c is None else f"{c:.1f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def plot(res: dict, path: str) -> None:
    """Latency against achieved output throughput, one curve per mode (p50 solid, p99 dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in ((axes[0], "ttft", "TTFT (ms)"), (axes[1], "tpot", "TPOT (ms)")):
        for mode, pts in res["points"].items():
            xs = [r["output_throughput"] for r in pts.values()]
            line, = ax.plot(xs, [r[f"p50_{metric}_ms"] for r in pts.values()], "o-", label=f"{mode} p50")
            ax.plot(xs, [r[f"p99_{metric}_ms"] for r in pts.values()], "s--", color=line.get_color(), label=f"{mode} p99")
            for x, rate, r in zip(xs, pts, pts.values()):
                ax.annotate(f"{rate}/s", (x, r[f"p50_{metric}_ms"]), fontsize=7)
        ax.set_xlabel("output tok/s")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.suptitle(f"rlt-serve, ouro-1.4b, input 512 / output {res.get('output_len', 128)}, "
                 f"{res['num_prompts']} requests per point")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    bench_main("serving", run, markdown, plot)
