"""Spike: does a batch-256 W8A8 + FP8 K/V decode step gain from two half batches on two streams?

    PYTHONPATH=. python3 docs/perf/raw/scripts-2026-12-06-session50/tbo_spike.py OUT.json [--keys 192] [--layers 24]          (GPU: times the schedules)
    TRITON_INTERPRET=1 PYTHONPATH=. python3 docs/perf/raw/scripts-2026-12-06-session50/tbo_spike.py OUT.json --cpu-smoke      (CPU: tiny shapes, bits only)

Per layer-loop, with Ouro-1.4B's shapes: the engine's FP8 decode call (`rope_paged_attention` over an FP8
cache, `perf.bench_decode_attention.engine_call`), then the W8A8 linears and the row quantizations
between them (qkv, quantize + o, gate_up with SwiGLU, quantize + down; each layer its own weights, so
they come from HBM). Schedules, each captured in one CUDA graph of `layers` layer-loops:

* `256 rows`: the whole batch on one stream (what the engine runs);
* `halves, one stream`: rows 0-127 then rows 128-255, each layer-loop (the cost of halving alone);
* `halves, two streams`: each half on its own stream, no order between them;
* `halves, two streams, alternating`: the same, and the attention calls of the two halves never run
  together (half b's waits for half a's, half a's next waits for half b's), so each half's attention
  overlaps the other's linears, as a two-batch-overlap step would schedule them.

The halves are row slices of the whole batch (same caches, tables, inputs and weights), so every
schedule must give the whole batch's bits (checked: the attention outputs and every linear's output).
Also timed: the attention alone and the linears alone, at 256 and 128 rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from perf import bench_decode_attention as bde
from rlt_kernels import gemm
from rlt_kernels.fp8 import quantize_weight_fp8
from rlt_kernels.fp8_rows import empty_rows, quantize_rows

HIDDEN, FFN, QKV = 2048, 5632, 3 * 2048


class Rows:
    """One slice of the batch: its attention call (over the shared FP8 cache, its own workspace) and
    its linears' buffers."""

    def __init__(self, case: dict, new: dict, x: torch.Tensor, lo: int, hi: int, context: int):
        c = dict(case, q=case["q"][lo:hi], tables=case["tables"][:, lo:hi], seq_lens=case["seq_lens"][lo:hi],
                 qsl=case["qsl"][: hi - lo + 1], kw={k: (v[lo:hi] if k == "query_depth" else v) for k, v in case["kw"].items()},
                 workspace=bde.attention.new_attention_workspace(hi - lo, bde.HEADS, bde.HEAD_DIM, context,
                                                                 device=x.device))
        n = {k: (v[lo:hi] if k in ("k", "v", "positions", "slots") else v) for k, v in new.items()}
        rows = hi - lo
        self.attn_out = torch.empty_like(c["q"])
        self.attention = bde.engine_call(c, n, self.attn_out)
        self.xq, self.xs = quantize_rows(x[lo:hi].contiguous())
        dev, bf = x.device, torch.bfloat16
        self.qkv = torch.empty(rows, QKV, dtype=bf, device=dev)
        self.o = torch.empty(rows, HIDDEN, dtype=bf, device=dev)
        self.act = torch.empty(rows, FFN, dtype=bf, device=dev)
        self.down = torch.empty(rows, HIDDEN, dtype=bf, device=dev)
        self.aq, self.as_ = empty_rows(self.attn_out.view(rows, -1))
        self.actq, self.acts = empty_rows(self.act)

    def linears(self, w: dict) -> None:
        gemm.linear(self.xq, w["qkv"][0], weight_scale=w["qkv"][1], x_scale=self.xs, out=self.qkv)
        quantize_rows(self.attn_out.view(self.attn_out.shape[0], -1), out=self.aq, out_scale=self.as_)
        gemm.linear(self.aq, w["o"][0], weight_scale=w["o"][1], x_scale=self.as_, out=self.o)
        gemm.linear(self.xq, w["gate_up"][0], weight_scale=w["gate_up"][1], x_scale=self.xs, out=self.act,
                    activation="swiglu")
        quantize_rows(self.act, out=self.actq, out_scale=self.acts)
        gemm.linear(self.actq, w["down"][0], weight_scale=w["down"][1], x_scale=self.acts, out=self.down)

    def outputs(self) -> list[torch.Tensor]:
        return [t.clone() for t in (self.attn_out, self.qkv, self.o, self.act, self.down)]


def schedules(full: Rows, a: Rows, b: Rows, weights: list[dict], streams) -> dict:
    """name -> callable issuing `len(weights)` layer-loops (see the module docstring)."""
    s1, s2 = streams

    def on(stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def fork(fn):
        def run():
            if s1 is None:
                return fn()
            main = torch.cuda.current_stream()
            s1.wait_stream(main)
            s2.wait_stream(main)
            fn()
            main.wait_stream(s1)
            main.wait_stream(s2)
        return run

    def whole():
        for w in weights:
            full.attention()
            full.linears(w)

    def halves_one_stream():
        for w in weights:
            for h in (a, b):
                h.attention()
                h.linears(w)

    def two_streams():
        for w in weights:
            for h, s in ((a, s1), (b, s2)):
                with on(s):
                    h.attention()
                    h.linears(w)

    def handoff(src, dst):
        """dst's later work waits for src's work issued so far (nothing to order on the CPU)."""
        if src is not None:
            done = torch.cuda.Event()
            done.record(src)
            dst.wait_event(done)

    def alternating():
        for w in weights:
            with on(s1):
                a.attention()
            handoff(s1, s2)
            with on(s2):
                b.attention()
            with on(s1):
                a.linears(w)
            handoff(s2, s1)  # a's next attention after b's
            with on(s2):
                b.linears(w)

    return {"256 rows": whole, "halves, one stream": halves_one_stream,
            "halves, two streams": fork(two_streams), "halves, two streams, alternating": fork(alternating),
            "attention alone, 256 rows": lambda: [full.attention() for _ in weights],
            "linears alone, 256 rows": lambda: [full.linears(w) for w in weights],
            "attention alone, 128 rows": lambda: [a.attention() for _ in weights],
            "linears alone, 128 rows": lambda: [a.linears(w) for w in weights]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--keys", type=int, default=192)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU: the bits check only")
    args = ap.parse_args()
    global HIDDEN, FFN, QKV
    device, context = "cuda", bde.CONTEXT_LIMIT
    if args.cpu_smoke:
        device, context, args.rows, args.layers, args.keys = "cpu", 128, 4, 2, 40
        bde.HEADS, bde.HEAD_DIM = 2, 32
        HIDDEN, FFN = 64, 96
    QKV = 3 * bde.HEADS * bde.HEAD_DIM
    assert HIDDEN == bde.HEADS * bde.HEAD_DIM
    torch.manual_seed(0)
    case = bde.fp8_case(bde.engine_case(args.rows, args.keys, context_limit=context, key_depth=False, device=device))
    new = bde.new_tokens(case, args.keys)
    gen = torch.Generator(device=device).manual_seed(1)

    def weight(n, k):
        return quantize_weight_fp8((torch.randn(n, k, device=device, generator=gen) * k ** -0.5).bfloat16())

    weights = [dict(qkv=weight(QKV, HIDDEN), o=weight(HIDDEN, HIDDEN), gate_up=weight(2 * FFN, HIDDEN),
                    down=weight(HIDDEN, FFN)) for _ in range(args.layers)]
    x = torch.randn(args.rows, HIDDEN, device=device, generator=gen).bfloat16()
    half = args.rows // 2
    full, a, b = (Rows(case, new, x, lo, hi, context) for lo, hi in ((0, args.rows), (0, half), (half, args.rows)))
    streams = (torch.cuda.Stream(), torch.cuda.Stream()) if device == "cuda" else (None, None)
    runs = schedules(full, a, b, weights, streams)
    res = {"rows": args.rows, "keys": args.keys, "layers": args.layers, "schedules": {}}
    if device == "cuda":
        from perf.roofline import measure

        res["roofline"] = measure()
    runs["256 rows"]()
    expected = full.outputs()
    for name, fn in runs.items():
        row = {}
        if device == "cuda":
            from perf.conftest import graph_replay_ms  # a failed capture raises: no eager timing

            row["us_per_layer_loop"] = graph_replay_ms(fn, replays=10)[0] * 1e3 / args.layers
        if not name.startswith(("attention alone", "linears alone")):
            for h in (full, a, b):
                for t in (h.attn_out, h.qkv, h.o, h.act, h.down):
                    t.zero_()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            got = [torch.cat([ta, tb]) for ta, tb in zip(a.outputs(), b.outputs())] if name != "256 rows" else full.outputs()
            row["same_bits"] = all(torch.equal(g.view(torch.int16), e.view(torch.int16)) for g, e in zip(got, expected))
        res["schedules"][name] = row
        print(f"{name:36s} {row}", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    bad = [n for n, r in res["schedules"].items() if r.get("same_bits") is False]
    if bad:
        raise SystemExit(f"schedules that changed bits: {bad}")


if __name__ == "__main__":
    main()
