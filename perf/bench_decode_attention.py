"""Decode attention as the engine runs it, against the roofline and library kernels, in one run.

    python -m perf.bench_decode_attention --out out/decode_attention [--sweep] [--context-limits 4096,65536]

Engine-shaped calls: Ouro-1.4B heads (16 x 128, MHA, bf16), 4 K/V planes, a key-depth table
(every key at full depth, query at loop 3: the key-depth lookups run, every read lands in the
query's plane; ``--no-key-depth`` drops it, as the engine's fixed-depth steps do), block size 16,
block tables as wide as Ouro's 64K context limit (as the engine's graphs capture them;
`--context-limits` times every case with tables of other widths too, in the same run), pages
scattered at random. For each (batch, keys) case it times, in CUDA graphs:

* rlt's decode arithmetic (``decode_from=0``, what decode, speculative drafts and verification run)
  and the tile arithmetic (``decode_from=None``, prompt rows; what decode ran before);
* the engine's decode call, ``rope_paged_attention``, over the bf16 and the FP8 cache: the same
  attention with each row's new token (position keys - 1) rotated and written into its slot of the
  query's plane, and q rotated, in the same launch where the engine fuses them (every FP8 launch,
  small bf16 ones) or as RoPE + scatter then attention where it does not;
* torch SDPA over a dense [B, H, keys, D] cache with the cuDNN and the FlashAttention backends
  (reads only K/V, no page table: a library's best case);
* cuDNN's paged SDPA through ``nvidia-cudnn-frontend`` on rlt's own cache (one plane, no
  key-depth indirection), where the package imports;
* FlashInfer's paged decode (``BatchDecodeWithPagedKVCacheWrapper``, CUDA-core decode as for MHA,
  CUDA-graph mode, its own split-KV plan) on the same plane of rlt's cache, bf16 and FP8 (one scale
  per tensor: FlashInfer takes scalar K/V scales), where ``flashinfer`` imports;
* rlt's decode arithmetic over the same cache in FP8 (``kv_cache_dtype="fp8"``: one scale per KV
  head), read as int32 words (the kernel's path for aligned caches), and through the per-byte cast
  that unaligned caches take; their fraction counts the FP8 bytes (half the K/V bytes).

K/V bytes read over the measured copy bandwidth give each figure's fraction of the roofline.
``--sweep`` also times decode-kernel geometries (warps, key tiles in flight) and says which keep
the default's bits (lanes and warps shape the reduction trees; tiles in flight must not).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

from perf.conftest import cuda_time_ms
from perf.roofline import measure
from rlt_kernels import attention
from rlt_kernels.attention import new_attention_workspace, paged_attention
from rlt_kernels.fp8 import FP8_DTYPE, FP8_MAX, quantize_fp8
from rlt_kernels.norms import rope_cos_sin

HEADS, HEAD_DIM, PLANES, BLOCK = 16, 128, 4, 16
ROPE_THETA = 1e6  # Ouro's
CONTEXT_LIMIT = 65536  # Ouro-1.4B's max_position_embeddings: the engine's block tables are this wide
CASES = [(1, 192), (16, 192), (64, 192), (256, 192), (64, 1024), (256, 1024), (64, 4096), (16, 32768), (64, 32768)]


def engine_case(batch: int, keys: int, seed: int = 0, context_limit: int = CONTEXT_LIMIT,
                key_depth: bool = True, device: str = "cuda") -> dict:
    """Inputs of one engine-shaped decode call (see the module docstring); block tables cover
    `context_limit` keys. key_depth=False: no key-depth table, as the engine's fixed-depth steps
    (no request may leave early) launch the kernel."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_seq = -(-keys // BLOCK)
    width = max(per_seq, context_limit // BLOCK)
    num_blocks = batch * per_seq  # every plane's table scatters the same blocks (only the query's plane is read)
    k = torch.randn(num_blocks, BLOCK, HEADS, HEAD_DIM, device=device, generator=gen).bfloat16()
    v = torch.randn(num_blocks, BLOCK, HEADS, HEAD_DIM, device=device, generator=gen).bfloat16()
    tables = torch.full((PLANES, batch, width), -1, dtype=torch.int32, device=device)
    for p in range(PLANES):
        tables[p, :, :per_seq] = torch.randperm(num_blocks, device=device, generator=gen).int().view(batch, per_seq)
    return dict(
        q=torch.randn(batch, HEADS, HEAD_DIM, device=device, generator=gen).bfloat16(), k=k, v=v, tables=tables,
        seq_lens=torch.full((batch,), keys, dtype=torch.int32, device=device),
        qsl=torch.arange(batch + 1, dtype=torch.int32, device=device),
        kw=dict(query_depth=torch.full((batch,), PLANES - 1, dtype=torch.int32, device=device),
                **({"key_depth": torch.full((num_blocks, BLOCK), PLANES - 1, dtype=torch.int8, device=device)}
                   if key_depth else {})),
        workspace=new_attention_workspace(batch, HEADS, HEAD_DIM, width * BLOCK, device=device),
    )


def kv_bytes(batch: int, keys: int) -> int:
    return 2 * batch * keys * HEADS * HEAD_DIM * 2


def fp8_plane(t: torch.Tensor, blocks_per_chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 K or V [blocks, BLOCK, H, D] -> (its FP8 copy, fp32 scales [H] = per-head amax / 448), taken a
    chunk of blocks at a time so the temporaries stay small beside a cache of many GB (a whole-tensor
    fp32 copy is what made 64 x 32768 run out of memory on an 80 GB card)."""
    chunks = t.split(blocks_per_chunk)
    scale = torch.stack([x.abs().amax(dim=(0, 1, 3)) for x in chunks]).amax(0).float() / FP8_MAX
    out = torch.empty(t.shape, dtype=FP8_DTYPE, device=t.device)
    for x, o in zip(chunks, out.split(blocks_per_chunk)):
        o.copy_(quantize_fp8(x, scale[None, None, :, None]))
    return out, scale


def fp8_case(c: dict) -> dict:
    """The case over an FP8 cache: K and V quantized with one scale per KV head (amax / 448)."""
    (k, k_scale), (v, v_scale) = fp8_plane(c["k"]), fp8_plane(c["v"])
    return dict(c, k=k, v=v, kw=dict(c["kw"], k_scale=k_scale, v_scale=v_scale))


def rlt_call(c: dict, out: torch.Tensor, decode_from):
    return lambda: paged_attention(c["q"], c["k"], c["v"], c["tables"], c["seq_lens"], c["qsl"], out=out,
                                   workspace=c["workspace"], decode_from=decode_from, **c["kw"])


def new_tokens(c: dict, keys: int, seed: int = 1) -> dict:
    """The engine call's own inputs: each row's new token, unrotated k and v [B, H, D] at position
    keys - 1 (the last key the call reads), its slot in the query's plane, and the RoPE table."""
    q = c["q"]
    gen = torch.Generator(device=q.device).manual_seed(seed)
    pos = keys - 1
    block = c["tables"][PLANES - 1, :, pos // BLOCK].long()
    return dict(k=torch.randn(q.shape, device=q.device, generator=gen).to(q.dtype),
                v=torch.randn(q.shape, device=q.device, generator=gen).to(q.dtype),
                positions=torch.full((q.shape[0],), pos, dtype=torch.int32, device=q.device),
                cos_sin=rope_cos_sin(keys, HEAD_DIM, ROPE_THETA, device=q.device), slots=block * BLOCK + pos % BLOCK)


def engine_call(c: dict, new: dict, out: torch.Tensor):
    """The engine's decode call on case c (or its FP8 form): writes the new tokens' K/V into c's cache."""
    return lambda: attention.rope_paged_attention(
        c["q"], new["k"], new["v"], new["positions"], new["cos_sin"], c["k"], c["v"], new["slots"], c["tables"],
        c["seq_lens"], c["qsl"], out=out, workspace=c["workspace"], **c["kw"])


def dense_kv(c: dict, keys: int):
    """The query plane's pages gathered into dense [B, H, keys, D] K and V."""
    plane = c["tables"][PLANES - 1][:, : -(-keys // BLOCK)].long()
    k = c["k"][plane].flatten(1, 2)[:, :keys].transpose(1, 2).contiguous()
    v = c["v"][plane].flatten(1, 2)[:, :keys].transpose(1, 2).contiguous()
    return k, v


def sdpa_ms(q, k, v, backend) -> float | None:
    from torch.nn.attention import sdpa_kernel

    try:
        with sdpa_kernel([backend]):
            return cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v))
    except RuntimeError:
        return None


def cudnn_paged(c: dict, keys: int):
    """A callable running cuDNN's paged SDPA on the query plane of rlt's cache, or an error string."""
    try:
        import cudnn
    except ImportError as exc:
        return f"cudnn frontend not importable: {exc}"
    b = c["q"].shape[0]
    plane = c["tables"][PLANES - 1]
    q4 = c["q"].view(b, HEADS, 1, HEAD_DIM)
    out4 = torch.empty_like(q4)
    k_container = c["k"].permute(0, 2, 1, 3)  # [blocks, H, block_size, D], strided over rlt's layout
    v_container = c["v"].permute(0, 2, 1, 3)
    table = plane[:, None, :, None].contiguous()  # [B, 1, blocks_per_seq, 1]
    seq_q = torch.ones(b, 1, 1, 1, dtype=torch.int32, device="cuda")
    seq_kv = c["seq_lens"].view(b, 1, 1, 1).contiguous()
    try:
        handle = cudnn.create_handle()
        graph = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
        tq, tk, tv = graph.tensor_like(q4), graph.tensor_like(k_container), graph.tensor_like(v_container)
        tt_k, tt_v = graph.tensor_like(table), graph.tensor_like(table)
        tsq, tskv = graph.tensor_like(seq_q), graph.tensor_like(seq_kv)
        to, _ = graph.sdpa(name="paged_decode", q=tq, k=tk, v=tv, is_inference=True, attn_scale=HEAD_DIM ** -0.5,
                           use_causal_mask=False, use_padding_mask=True, seq_len_q=tsq, seq_len_kv=tskv,
                           paged_attention_k_table=tt_k, paged_attention_v_table=tt_v,
                           paged_attention_max_seq_len_kv=table.shape[2] * BLOCK)
        to.set_output(True).set_dim(list(out4.shape)).set_stride(list(out4.stride()))
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        ws = torch.empty(graph.get_workspace_size(), dtype=torch.uint8, device="cuda")
        pack = {tq: q4, tk: k_container, tv: v_container, tt_k: table, tt_v: table, tsq: seq_q, tskv: seq_kv, to: out4}
        def fn():  # cuDNN runs on its handle's stream: point it at the caller's (a CUDA graph capture's)
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
            graph.execute(pack, ws, handle=handle)
        fn()
        torch.cuda.synchronize()
        return fn, out4.view(b, HEADS, HEAD_DIM)
    except Exception as exc:  # noqa: BLE001 - an unsupported configuration is a result to report
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def flashinfer_paged(c: dict, keys: int, fp8: bool):
    """A callable running FlashInfer's paged decode on the query plane of rlt's cache (an FP8 copy
    with one scale per tensor when fp8), with its output, or an error string."""
    try:
        import flashinfer
    except Exception as exc:  # noqa: BLE001 - a missing or broken install is a result to report
        return f"flashinfer not importable: {type(exc).__name__}: {str(exc)[:200]}"
    b, per_seq = c["q"].shape[0], -(-keys // BLOCK)
    indices = c["tables"][PLANES - 1][:, :per_seq].contiguous().flatten()
    indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * per_seq
    last = torch.full((b,), keys - (per_seq - 1) * BLOCK, dtype=torch.int32, device="cuda")
    k, v, k_scale, v_scale = c["k"], c["v"], None, None
    if fp8:
        k_scale, v_scale = (t.float().abs().amax().item() / FP8_MAX for t in (k, v))
        k, v = quantize_fp8(k, torch.tensor(k_scale, device="cuda")), quantize_fp8(v, torch.tensor(v_scale, device="cuda"))
    try:
        workspace = torch.zeros(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
        wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
            workspace, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr.clone(),
            paged_kv_indices_buffer=indices.clone(), paged_kv_last_page_len_buffer=last.clone())
        wrapper.plan(indptr, indices, last, HEADS, HEADS, HEAD_DIM, BLOCK,
                     q_data_type=c["q"].dtype, kv_data_type=k.dtype)
        out = torch.empty_like(c["q"])
        fn = lambda: wrapper.run(c["q"], (k, v), k_scale=k_scale, v_scale=v_scale, out=out)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        return fn, out
    except Exception as exc:  # noqa: BLE001 - an unsupported configuration is a result to report
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def measure_case(batch: int, keys: int, roof: dict, context_limit: int = CONTEXT_LIMIT,
                 key_depth: bool = True) -> dict:
    from torch.nn.attention import SDPBackend

    c = engine_case(batch, keys, context_limit=context_limit, key_depth=key_depth)
    nbytes = kv_bytes(batch, keys)
    gbps = lambda ms: nbytes / (ms * 1e-3) / 1e9 if ms else None  # noqa: E731
    frac = lambda ms: gbps(ms) / roof["copy_gbps"] if ms else None  # noqa: E731
    out_d, out_t = torch.empty_like(c["q"]), torch.empty_like(c["q"])
    decode_ms = cuda_time_ms(rlt_call(c, out_d, 0))
    tile_ms = cuda_time_ms(rlt_call(c, out_t, None))
    k, v = dense_kv(c, keys)
    q4 = c["q"].view(batch, HEADS, 1, HEAD_DIM)
    ref = F.scaled_dot_product_attention(q4.float(), k.float(), v.float()).view(batch, HEADS, HEAD_DIM)
    row = {"batch": batch, "keys": keys, "context_limit": context_limit, "key_depth": key_depth,
           "kv_mb": nbytes / 1e6,
           "decode_us": decode_ms * 1e3, "decode_gbps": gbps(decode_ms), "decode_frac": frac(decode_ms),
           "decode_max_err": (out_d.float() - ref).abs().max().item(),
           "tile_us": tile_ms * 1e3, "tile_frac": frac(tile_ms), "tile_max_err": (out_t.float() - ref).abs().max().item()}
    f8 = fp8_case(c)
    out_f = torch.empty_like(c["q"])
    fp8_ms = cuda_time_ms(rlt_call(f8, out_f, 0))
    aligned = attention._kv_rows_aligned
    attention._kv_rows_aligned = lambda cache: False  # the per-byte cast of unaligned caches
    try:
        fp8_bytes_ms = cuda_time_ms(rlt_call(f8, torch.empty_like(c["q"]), 0))
    finally:
        attention._kv_rows_aligned = aligned
    row.update(fp8_decode_us=fp8_ms * 1e3, fp8_decode_frac=frac(fp8_ms) / 2,  # half the bytes
               fp8_decode_max_err=(out_f.float() - ref).abs().max().item(),
               fp8_byte_path_us=fp8_bytes_ms * 1e3, fp8_byte_path_frac=frac(fp8_bytes_ms) / 2)
    del f8
    for name, backend in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        ms = sdpa_ms(q4, k, v, backend)
        row[f"{name}_us"] = ms * 1e3 if ms else None
        row[f"{name}_frac"] = frac(ms)
    del k, v
    paged = cudnn_paged(c, keys)
    if isinstance(paged, str):
        row["cudnn_paged_error"] = paged
    else:
        fn, got = paged
        ms = cuda_time_ms(fn)
        row.update(cudnn_paged_us=ms * 1e3, cudnn_paged_frac=frac(ms), cudnn_paged_max_err=(got.float() - ref).abs().max().item())
    for name, fp8 in (("flashinfer", False), ("flashinfer_fp8", True)):
        paged = flashinfer_paged(c, keys, fp8)
        if isinstance(paged, str):
            row[f"{name}_error"] = paged
            continue
        fn, got = paged
        ms = cuda_time_ms(fn)
        row.update({f"{name}_us": ms * 1e3, f"{name}_frac": frac(ms) / (2 if fp8 else 1),
                    f"{name}_max_err": (got.float() - ref).abs().max().item()})
        del paged, fn, got
    new = new_tokens(c, keys)  # last: the engine call writes each row's last key
    for name, fp8 in (("engine_call", False), ("fp8_engine_call", True)):
        ms = cuda_time_ms(engine_call(fp8_case(c) if fp8 else c, new, torch.empty_like(c["q"])))
        row.update({f"{name}_us": ms * 1e3, f"{name}_frac": frac(ms) / (2 if fp8 else 1)})
    return row


def sweep(roof: dict) -> list[dict]:
    """Decode geometries (key lanes, warps, pipeline stages, key tiles in flight) at the engine
    cases over bf16 caches; `same_bits` against the default geometry."""
    names = ("DECODE_LANE_ELEMENTS", "DECODE_WARPS", "DECODE_STAGES", "DECODE_TILES", "DECODE_TILES_SMALL_LAUNCH")
    default = tuple(getattr(attention, n) for n in names)
    rows = []
    cases = [(1, 192), (16, 192), (64, 192), (256, 192), (256, 1024), (1, 4096), (64, 4096)]
    inputs = {case: engine_case(*case) for case in cases}
    reference = {}
    variants = [default] + [(16, warps, 1, tiles, tiles) for warps in (2, 4, 8) for tiles in (1, 2)
                            if (16, warps, 1, tiles, tiles) != default]
    for variant in variants:
        for n, value in zip(names, variant):
            setattr(attention, n, value)
        geometry = dict(zip(("lanes", "warps", "stages", "tiles"), variant))
        for (batch, keys), c in inputs.items():
            out = torch.empty_like(c["q"])
            try:
                ms = cuda_time_ms(rlt_call(c, out, 0))
            except Exception as exc:  # noqa: BLE001 - a geometry that does not compile or fit
                rows.append({**geometry, "batch": batch, "keys": keys, "error": str(exc)[:200]})
                continue
            bits = out.view(torch.int16).clone()
            reference.setdefault((batch, keys), bits)
            rows.append({**geometry, "batch": batch, "keys": keys,
                         "us": ms * 1e3, "frac": kv_bytes(batch, keys) / (ms * 1e-3) / 1e9 / roof["copy_gbps"],
                         "same_bits": bool(torch.equal(bits, reference[(batch, keys)]))})
            print("sweep", rows[-1], flush=True)
    for n, value in zip(names, default):
        setattr(attention, n, value)
    return rows


def markdown(res: dict) -> str:
    roof = res["roofline"]
    pct = lambda x: f"{100 * x:.0f}%" if x else "-"  # noqa: E731
    us = lambda x: f"{x:.1f}" if x else "-"  # noqa: E731
    lines = [f"{res['date']}, {roof['gpu']}, torch {roof['torch']}, Triton {roof['triton']}; copy "
             f"{roof['copy_gbps']:.0f} GB/s. µs per call (share of the copy bandwidth reading K/V once).", "",
             "| tables cover | batch | keys | K/V MB | rlt decode | rlt tile (prompt rows) | SDPA cuDNN, dense | SDPA FA2, dense | cuDNN paged "
             "| FlashInfer paged | rlt decode, FP8 cache (words) | FP8, per-byte cast | FlashInfer paged, FP8 "
             "| engine call (RoPE + K/V write + decode) | engine call, FP8 cache |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["cases"]:
        lines.append(f"| {r['context_limit']} | {r['batch']} | {r['keys']} | {r['kv_mb']:.1f} | "
                     f"{us(r['decode_us'])} ({pct(r['decode_frac'])}) | "
                     f"{us(r['tile_us'])} ({pct(r['tile_frac'])}) | {us(r['sdpa_cudnn_us'])} ({pct(r['sdpa_cudnn_frac'])}) | "
                     f"{us(r['sdpa_flash_us'])} ({pct(r['sdpa_flash_frac'])}) | "
                     f"{us(r.get('cudnn_paged_us'))} ({pct(r.get('cudnn_paged_frac'))}) | "
                     f"{us(r.get('flashinfer_us'))} ({pct(r.get('flashinfer_frac'))}) | "
                     f"{us(r['fp8_decode_us'])} ({pct(r['fp8_decode_frac'])}) | "
                     f"{us(r['fp8_byte_path_us'])} ({pct(r['fp8_byte_path_frac'])}) | "
                     f"{us(r.get('flashinfer_fp8_us'))} ({pct(r.get('flashinfer_fp8_frac'))}) | "
                     f"{us(r.get('engine_call_us'))} ({pct(r.get('engine_call_frac'))}) | "
                     f"{us(r.get('fp8_engine_call_us'))} ({pct(r.get('fp8_engine_call_frac'))}) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--cases", default=",".join(f"{b}x{k}" for b, k in CASES),
                    help="comma-separated BATCHxKEYS cases (default: every case of CASES)")
    ap.add_argument("--context-limits", default=str(CONTEXT_LIMIT),
                    help="comma-separated keys the block tables cover, each a table of every case (e.g. 4096,65536)")
    ap.add_argument("--no-key-depth", action="store_true",
                    help="no key-depth table: the kernel as the engine's fixed-depth steps launch it")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    roof = measure()
    res = {"date": time.strftime("%Y-%m-%d"), "roofline": roof, "cases": []}
    try:
        import cudnn

        res["cudnn"] = {"frontend": getattr(cudnn, "__version__", "?"), "backend": cudnn.backend_version()}
    except ImportError:
        res["cudnn"] = None
    try:
        import flashinfer

        res["flashinfer"] = flashinfer.__version__
    except Exception:  # noqa: BLE001 - reported per case
        res["flashinfer"] = None
    for limit in (int(x) for x in args.context_limits.split(",")):
        for batch, keys in (tuple(int(x) for x in case.split("x")) for case in args.cases.split(",")):
            res["cases"].append(measure_case(batch, keys, roof, limit, key_depth=not args.no_key_depth))
            print(json.dumps(res["cases"][-1]), flush=True)
            torch.cuda.empty_cache()
    if args.sweep:
        res["sweep"] = sweep(roof)
    with open(os.path.join(args.out, "decode_attention.json"), "w") as f:
        json.dump(res, f, indent=1)
    table = markdown(res)
    with open(os.path.join(args.out, "decode_attention.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
