"""Turn a pytest-benchmark JSON of perf/test_bench_*.py into a markdown table and a plot.

    python -m perf.report_kernels out/kernels.json out/
"""

from __future__ import annotations

import json
import os
import sys


def rows(data: dict) -> list[dict]:
    out = []
    for b in data["benchmarks"]:
        info = dict(b.get("extra_info", {}))
        info.setdefault("name", b["name"])
        info["test"] = b["name"]
        out.append(info)
    return out


def _fmt(v, pattern):
    return "" if v is None else pattern.format(v)


def markdown(entries: list[dict]) -> str:
    if not entries:
        return "No benchmark results.\n"
    roof = next((e["roofline"] for e in entries if "roofline" in e), {})
    head = (f"GPU {roof.get('gpu')}, torch {roof.get('torch')}, triton {roof.get('triton')}: measured copy bandwidth "
            f"{roof.get('copy_gbps', 0):.0f} GB/s, bf16 GEMM {roof.get('gemm_tflops', 0):.0f} TFLOP/s.\n\n")
    lines = ["| benchmark | ms | GB/s | of bandwidth | TFLOP/s | of GEMM rate | vs torch baseline |", "|---|---|---|---|---|---|---|"]
    for e in entries:
        lines.append(
            f"| {e['test']} | {_fmt(e.get('ms'), '{:.4f}')} | {_fmt(e.get('gbps'), '{:.0f}')} | "
            f"{_fmt(e.get('frac_bandwidth'), '{:.0%}')} | {_fmt(e.get('tflops'), '{:.1f}')} | "
            f"{_fmt(e.get('frac_gemm'), '{:.0%}')} | {_fmt(e.get('speedup_vs_baseline'), '{:.2f}x')} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(entries: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bw = [(e["test"], e["frac_bandwidth"]) for e in entries if e.get("frac_bandwidth") is not None]
    if not bw:
        return
    bw = bw[:60]
    fig, ax = plt.subplots(figsize=(10, max(4, len(bw) * 0.18)))
    ax.barh([n.replace("test_", "")[:60] for n, _ in bw], [f for _, f in bw])
    ax.axvline(1.0, color="k", linestyle="--", linewidth=0.8)
    ax.set_xlabel("fraction of measured copy bandwidth")
    ax.tick_params(axis="y", labelsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        entries = rows(json.load(f))
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "kernels.md"), "w") as f:
        f.write(markdown(entries))
    plot(entries, os.path.join(out, "kernels.png"))


if __name__ == "__main__":
    main()
