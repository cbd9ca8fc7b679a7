"""Profiling: the capacity planner's peak-memory probe and torch.profiler traces of chosen steps."""

from __future__ import annotations

import os
import time

import torch


def profile_step_peak(worker, graphs: bool) -> int:
    """Peak bytes above the weights needed by the largest steps, measured on CUDA.

    Runs (a) one loop of a prefill at the full token budget and (b) the whole decode program at
    `max_num_seqs` rows with logprobs, on the runner's one-block probe cache (every table entry
    points at block 0, so the writes are harmless). With CUDA graphs the two graph pools (prefill
    and decode buckets) hold their peaks on top of the largest eager step.
    """
    runner, dev, mc = worker.runner, worker.device, worker.spec.model_config
    n = worker.spec.max_tokens
    bs = runner.block_size
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)

    def measure(fn) -> int:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        with torch.no_grad():
            fn()
        torch.cuda.synchronize(dev)
        return torch.cuda.max_memory_allocated(dev) - base

    from ..sampling_params import MAX_LOGPROBS
    from .forward_batch import ForwardBatch, KVCacheTensors

    probe_tables = torch.zeros((runner.layout.num_planes, 1, -(-n // bs)), dtype=torch.int32, device=dev)
    kv = KVCacheTensors(runner.kv.k, runner.kv.v, probe_tables, runner.kv.key_depth, runner.kv.k_scale, runner.kv.v_scale)
    pos = torch.arange(n, dtype=torch.int64, device=dev)
    batch = ForwardBatch(
        ops=runner.ops, kv=kv, positions=pos, token_slots=torch.zeros(n, dtype=torch.int32, device=dev),
        seq_slots=torch.zeros(1, dtype=torch.int32, device=dev), seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev), cos_sin=runner.cos_sin,
        rope_style=runner.model.rope_style,
    )
    tokens = torch.zeros(n, dtype=torch.int64, device=dev)

    def prefill():
        model = runner.model
        if mc.family == "ouro":
            h = model.loop(model.embed(tokens), None, batch, 0)
        else:
            e = model.embed(tokens, batch)
            h = model.coda(model.loop(torch.zeros_like(e), e, batch, 0), batch)
        model.logits(h[: runner.max_rows], runner.ops)

    rows = runner.max_rows
    runner.kv.block_tables.zero_()
    runner.dec_in.write("slots", list(range(rows)))
    runner.slot_pos.zero_()
    runner.dec_in.write("trace", [runner.depth] * rows)
    runner.dec_in.write("num_rows", [rows])
    runner.dec_in.upload()
    prefill_peak = measure(prefill)
    decode_peak = measure(lambda: runner.decode_program(rows, True, min(MAX_LOGPROBS, mc.vocab_size), True))
    runner.kv.block_tables.fill_(-1)
    runner.slot_token.zero_()
    torch.cuda.empty_cache()
    return int(max(prefill_peak, decode_peak) + (prefill_peak + decode_peak if graphs else 0))


def count_host_syncs(fn) -> int:
    """Run fn() under CUDA sync debug mode and count the host synchronisations it reports."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


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
