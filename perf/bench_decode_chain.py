"""A decode step's layer-loops as one CUDA graph of rlt kernels, against the weight-byte floor.

    python -m perf.bench_decode_chain --out out/decode_chain [--batches 1,16,64] [--variants ...] [--ablate] [--fp8]
                                     [--context 65536] [--live 256,192,128,64]

Ouro-1.4B shapes (hidden 2048, 16 x 128 heads, MLP 5632, 24 layers, 4 loops: 96 layer-loops), bf16,
each layer its own weights, 192 keys per sequence in block tables as wide as the engine's 65,536 keys (so the
attention splits its keys as the engine's graphs do at small batches): per layer-loop the engine's kernels -- qkv
linear, RoPE + K/V scatter, decode attention (+ split combine), o linear + residual norm, SwiGLU
linear, down linear + residual norm. No sampling, no exit gate: what is left is the chain whose
kernel count and dependent launches decide a small batch's step.

Each variant is a way of launching the same chain (dependent launches off or on, split decode
attention merging its key ranges in place with range counters instead of a combine kernel);
every variant must give the bits of plain
stream order (checked), and each is timed as the median of graph replays. The floor
is the layer weights' bytes over the copy bandwidth measured in the same run. --fp8: the layer
weights as FP8 with per-channel scales (quantization="fp8"), the floor at one byte a weight.
--live: the engine's launch at each batch with only the first N rows live (every kernel takes the
live count, as the loops of an early-exit step do after rows have left; the graph keeps the batch's
rows), kernel by kernel as --ablate, to show which kernels' time shrinks with the live rows.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from perf.conftest import graph_replay_ms
from perf.roofline import measure
from rlt_kernels import attention, gemm, kv_cache, linear_norm, norms
from rlt_kernels.fp8 import quantize_weight_fp8

HIDDEN, HEADS, HEAD_DIM, FFN, LAYERS, LOOPS, KEYS, BLOCK = 2048, 16, 128, 5632, 24, 4, 192, 16
# Block tables as wide as the engine's for Ouro-1.4B (its 65,536-key context): the table width sets a
# split decode launch's range programs, and with them its launch (`--context`; the docs/perf tables
# before 2026-12-03's session 16 used 4,096).
MAX_CONTEXT = 65536
VARIANTS = {  # name: (launch environment, split decode attention merging its key ranges in place,
    #                RoPE + K/V write inside the attention launch)
    "stream order": ({"RLT_PDL": "0"}, False, False),
    "dependent launches": ({}, False, False),
    "dependent launches + in-place merge": ({}, True, False),
    "dependent launches + in-place merge + RoPE in attention": ({}, True, True),
}
ENGINE_VARIANT = "dependent launches + in-place merge + RoPE in attention"  # what the engine's decode runs
KNOBS = ("RLT_PDL",)
# Ablations (--ablate): the engine's launch (dependent launches, in-place merge) with kernels left
# out, each dropped kernel's output replaced by its input; what each kernel costs in the chain.
ABLATIONS = {"full": (), "without RoPE + scatter": ("rope",), "without attention": ("attention",),
             "without residual norms": ("norms",), "GEMVs only": ("rope", "attention", "norms")}


class Chain:
    """Weights, caches and buffers of the chain at one batch size (the caches hold random keys);
    fp8: the four linear weights of every layer as FP8 with per-channel scales."""

    def __init__(self, batch: int, device="cuda", dtype=torch.bfloat16, fp8: bool = False, context: int | None = None):
        g = torch.Generator(device=device).manual_seed(0)

        def rand(*shape, scale=1.0):
            return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

        qkv = 3 * HEADS * HEAD_DIM
        self.layers = [dict(qkv=rand(qkv, HIDDEN, scale=HIDDEN**-0.5), o=rand(HIDDEN, HIDDEN, scale=HIDDEN**-0.5),
                            gate_up=rand(2 * FFN, HIDDEN, scale=HIDDEN**-0.5), down=rand(HIDDEN, FFN, scale=FFN**-0.5),
                            norms=[rand(HIDDEN) + 1 for _ in range(4)]) for _ in range(LAYERS)]
        self.scales = [{} for _ in self.layers]  # FP8 weights' scales by name
        if fp8:
            for w, scales in zip(self.layers, self.scales):
                for name in ("qkv", "o", "gate_up", "down"):
                    w[name], scales[name] = quantize_weight_fp8(w[name])
        blocks_per_seq = -(-(KEYS + 1) // BLOCK)
        pages = torch.randperm(batch * blocks_per_seq, device=device, generator=g).to(torch.int32)
        context = context or MAX_CONTEXT  # keys the tables cover, as the launch's split rule sees them
        self.tables = torch.zeros(1, batch, context // BLOCK, dtype=torch.int32, device=device)
        self.tables[0, :, :blocks_per_seq] = pages.view(batch, blocks_per_seq)
        self.caches = [(rand(batch * blocks_per_seq, BLOCK, HEADS, HEAD_DIM),
                        rand(batch * blocks_per_seq, BLOCK, HEADS, HEAD_DIM)) for _ in range(LAYERS)]
        self.positions = torch.full((batch,), KEYS, dtype=torch.int64, device=device)
        slot_block = self.tables[0, :, KEYS // BLOCK].long()
        self.slots = slot_block * BLOCK + KEYS % BLOCK
        self.seq_lens = (self.positions + 1).to(torch.int32)
        self.qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
        self.cos_sin = norms.rope_cos_sin(4096, HEAD_DIM, 10000.0, device=device)
        self.workspace = attention.new_attention_workspace(batch, HEADS, HEAD_DIM, context, device=device)
        self.h0 = rand(batch, HIDDEN)
        self.batch = batch
        self.range_counters = attention.new_range_counters(device)
        self.merge_in_place = False
        self.fused_rope = False  # rope_paged_attention instead of rope_kv_scatter + paged_attention
        self.drop = frozenset()  # ABLATIONS: kernels left out (timing only; the output is meaningless)
        self.live = None  # int32 [1]: rows every launch computes (None: all); the rest stay untouched

    def set_live(self, rows: int | None) -> None:
        """Compute only the first `rows` rows in every launch (None: all of them)."""
        if rows is not None and not 1 <= rows <= self.batch:
            raise ValueError(f"live rows must be in 1..{self.batch}, got {rows}")
        self.live = None if rows is None else torch.tensor([rows], dtype=torch.int32, device=self.h0.device)

    def step(self) -> torch.Tensor:
        """All layer-loops of one decode step; returns the last normed state [batch, hidden]."""
        b, eps = self.batch, 1e-6
        range_counters = self.range_counters if self.merge_in_place else None
        live = self.live
        h = self.h0
        n = norms.rms_norm(h, self.layers[0]["norms"][0], eps, active_rows=live)
        for _ in range(LOOPS):
            for i, w in enumerate(self.layers):
                sc = self.scales[i]
                qkv = gemm.linear(n, w["qkv"], weight_scale=sc.get("qkv"), active_rows=live)
                q, k, v = (qkv[:, j * HEADS * HEAD_DIM:(j + 1) * HEADS * HEAD_DIM].view(b, HEADS, HEAD_DIM)
                           for j in range(3))
                kc, vc = self.caches[i]
                if self.fused_rope and not self.drop:
                    attn = attention.rope_paged_attention(
                        q, k, v, self.positions, self.cos_sin, kc, vc, self.slots, self.tables, self.seq_lens,
                        self.qsl, workspace=self.workspace, range_counters=range_counters, active_seqs=live).view(b, -1)
                else:
                    q_rot = q if "rope" in self.drop else kv_cache.rope_kv_scatter(
                        q, k, v, self.positions, self.cos_sin, kc, vc, self.slots, active_rows=live)
                    attn = q_rot.reshape(b, -1) if "attention" in self.drop else attention.paged_attention(
                        q_rot, kc, vc, self.tables, self.seq_lens, self.qsl, workspace=self.workspace, decode_from=0,
                        range_counters=range_counters, active_seqs=live).view(b, -1)
                if "norms" in self.drop:
                    h = n = gemm.linear(attn, w["o"], weight_scale=sc.get("o"), active_rows=live)
                else:
                    h, n = linear_norm.linear_residual_norm(attn, w["o"], h, w["norms"][1], w["norms"][2], eps,
                                                            weight_scale=sc.get("o"), active_rows=live)
                act = gemm.linear(n, w["gate_up"], activation="swiglu", weight_scale=sc.get("gate_up"), active_rows=live)
                if "norms" in self.drop:
                    h = n = gemm.linear(act, w["down"], weight_scale=sc.get("down"), active_rows=live)
                else:
                    h, n = linear_norm.linear_residual_norm(act, w["down"], h, w["norms"][3], w["norms"][0], eps,
                                                            weight_scale=sc.get("down"), active_rows=live)
        return n


def weight_bytes(fp8: bool = False) -> int:
    """Layer weight bytes one step reads (bf16, or FP8 with fp8, every layer-loop)."""
    per_layer = (3 * HEADS * HEAD_DIM + HIDDEN + 2 * FFN) * HIDDEN + HIDDEN * FFN
    return per_layer * (1 if fp8 else 2) * LAYERS * LOOPS


def time_variant(chain: Chain, variant: tuple, replays: int = 20) -> tuple[float, torch.Tensor]:
    """(median ms per graph replay, the step's output) launched as `variant` (see VARIANTS)."""
    env, chain.merge_in_place, chain.fused_rope = variant
    for key in KNOBS:
        os.environ.pop(key, None)
    os.environ.update(env)
    try:
        return graph_replay_ms(chain.step, replays)
    finally:
        for key in KNOBS:
            os.environ.pop(key, None)


def ablate(batches: list[int], fp8: bool = False, context: int | None = None, live: list[int] | None = None) -> dict:
    """µs per layer-loop of each ABLATIONS entry at each batch (timing only); with `live`, at
    each live-row count of each batch (counts above the batch are skipped)."""
    roof = measure()
    res = {"roofline": roof, "fp8": fp8,
           "floor_us_per_layer_loop": weight_bytes(fp8) / roof["copy_gbps"] / 1e3 / (LAYERS * LOOPS), "batches": {}}
    for b in batches:
        chain, rows = Chain(b, fp8=fp8, context=context), {}
        for n_live in [r for r in live if r <= b] if live else [None]:
            chain.set_live(n_live)
            for name, drop in ABLATIONS.items():
                chain.drop = frozenset(drop)
                ms, _ = time_variant(chain, VARIANTS[ENGINE_VARIANT])
                key = name if n_live is None else f"{n_live} live: {name}"
                rows[key] = ms * 1e3 / (LAYERS * LOOPS)
                print(f"batch {b:4d}  {key:34s} {rows[key]:6.1f} us per layer-loop", flush=True)
        res["batches"][b] = rows
        del chain
        torch.cuda.empty_cache()
    return res


def run(batches: list[int], variants: list[str], fp8: bool = False, context: int | None = None) -> dict:
    roof = measure()
    floor = weight_bytes(fp8) / (roof["copy_gbps"] * 1e9) * 1e3
    res = {"roofline": roof, "fp8": fp8, "floor_ms": floor, "layer_loops": LAYERS * LOOPS, "batches": {}}
    for b in batches:
        chain = Chain(b, fp8=fp8, context=context)
        rows, reference = {}, None
        for name in variants:
            ms, out = time_variant(chain, VARIANTS[name])
            reference = out if reference is None else reference
            rows[name] = {"ms": ms, "of_floor": floor / ms, "same_bits": bool(torch.equal(out, reference))}
            print(f"batch {b:4d}  {name:32s} {ms:7.3f} ms  {floor / ms:5.1%} of floor  "
                  f"bits {'same' if rows[name]['same_bits'] else 'DIFFER'}", flush=True)
        res["batches"][b] = rows
        del chain
        torch.cuda.empty_cache()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/decode_chain")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    ap.add_argument("--ablate", action="store_true", help="time the chain with kernels left out (ABLATIONS)")
    ap.add_argument("--fp8", action="store_true", help="FP8 layer weights (quantization='fp8')")
    ap.add_argument("--context", type=int, default=MAX_CONTEXT, help="keys the block tables cover (the engine's: 65536)")
    ap.add_argument("--live", default=None, help="comma-separated live-row counts: the ablation at each (implies --ablate)")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    live = [int(r) for r in args.live.split(",")] if args.live else None
    res = (ablate(batches, args.fp8, args.context, live) if args.ablate or live
           else run(batches, args.variants.split(","), args.fp8, args.context))
    res["context"], res["live"] = args.context, live
    os.makedirs(args.out, exist_ok=True)
    name = ("decode_chain_live" if live else "decode_chain_ablation" if args.ablate else "decode_chain") + ("_fp8" if args.fp8 else "")
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
