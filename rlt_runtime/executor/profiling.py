"""Profiling: the capacity planner's peak-memory probe and torch.profiler traces of chosen steps."""

from __future__ import annotations

import os
import time

import torch


def profile_step_peak(engine) -> int:
    """Peak bytes above the current allocation of the largest step the engine can schedule.

    Runs the model once at the full token budget (prefill, one loop at a time) with a throwaway
    one-block-per-row cache, which bounds the activations of any prefill or decode step.
    """
    from .forward_batch import ForwardBatch, KVCacheTensors

    dev, mc, layout = engine.device, engine.model_config, engine.layout
    n = engine.max_num_batched_tokens
    bs = engine.cfg.block_size
    blocks = -(-n // bs)
    shape = (layout.num_cache_layers, blocks, bs, mc.kv_heads, mc.head_dim)
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    kv = KVCacheTensors(
        k=torch.zeros(shape, dtype=engine.dtype, device=dev), v=torch.zeros(shape, dtype=engine.dtype, device=dev),
        block_tables=torch.arange(blocks, dtype=torch.int32, device=dev).repeat(layout.num_planes, 1, 1),
        key_depth=torch.zeros((blocks, bs), dtype=torch.int32, device=dev),
    )
    cache_bytes = 2 * kv.k.numel() * kv.k.element_size()
    from rlt_kernels.norms import rope_cos_sin

    pos = torch.arange(n, dtype=torch.int64, device=dev)
    batch = ForwardBatch(
        ops=engine.ops, kv=kv, positions=pos, token_slots=torch.zeros(n, dtype=torch.int32, device=dev),
        seq_slots=torch.zeros(1, dtype=torch.int32, device=dev), seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
        cos_sin=rope_cos_sin(n, mc.head_dim, mc.rope_theta, device=dev), rope_style=engine.model.rope_style,
    )
    tokens = torch.zeros(n, dtype=torch.int64, device=dev)
    with torch.no_grad():
        if mc.family == "ouro":
            h = engine.model.loop(engine.model.embed(tokens), batch, 0)
            logits = engine.model.logits(h[: engine.max_num_seqs], engine.ops)
        else:
            e = engine.model.embed(tokens, batch)
            s = engine.model.loop(torch.zeros_like(e), e, batch, 0)
            logits = engine.model.logits(engine.model.coda(s, batch)[: engine.max_num_seqs], engine.ops)
        del logits
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - base - cache_bytes
    del kv, batch
    torch.cuda.empty_cache()
    return int(peak)


def start_profiler():
    """Start a torch.profiler session recording shapes and stacks (CPU + CUDA when present)."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts, record_shapes=True, with_stack=True)
    prof.__enter__()
    return prof


def stop_profiler(prof, out_dir: str, device) -> str:
    """Stop the session and write a Chrome trace into out_dir; returns its path."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    prof.__exit__(None, None, None)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"rlt-trace-{int(time.time())}.json")
    prof.export_chrome_trace(path)
    return path
