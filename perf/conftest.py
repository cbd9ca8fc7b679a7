"""Kernel microbenchmarks (pytest-benchmark). Run on a GPU:

    pytest perf/ --benchmark-json=out/kernels.json

Each benchmark records, in ``benchmark.extra_info``: the bytes and FLOPs it moves, the achieved
GB/s or TFLOP/s, its fraction of the roofline measured in the same session (`roofline`
fixture), and the same figures for the plain-torch baseline it is compared with.
"""

import pytest
import torch

from perf.roofline import measure

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="benchmarks need a CUDA device")


@pytest.fixture(scope="session")
def roofline():
    return measure()


def cuda_time_ms(fn, warmup: int = 5, iters: int = 50, reps: int = 20) -> float:
    """Device time of one fn() call in milliseconds.

    fn is captured `reps` times into a CUDA graph whose replays are timed with events, so the
    Python launch overhead (tens of microseconds per Triton launch) is not counted; this is how
    the engine runs kernels. Callables that cannot be captured (host-synchronising torch
    baselines) fall back to timing eager calls.
    """
    from perf.roofline import _time_ms

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
        stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(reps):
                fn()
    except RuntimeError:
        torch.cuda.synchronize()
        return _time_ms(fn, warmup=warmup, iters=iters)
    torch.cuda.current_stream().wait_stream(stream)
    return _time_ms(graph.replay, warmup=2, iters=max(3, iters // reps)) / reps


def graph_replay_ms(fn, replays: int = 20):
    """(median ms of one replay of fn() captured in a CUDA graph, a copy of the tensor the captured
    fn() returned, as the replays left it, or None). fn runs once before the capture (it compiles
    there); a capture that fails raises: no eager fallback as in `cuda_time_ms`, whose launch
    overhead would hide what schedules of the same kernels differ by."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2], out.clone() if isinstance(out, torch.Tensor) else None


def record(benchmark, roofline, *, name, ms, bytes_moved=0, flops=0, baseline_ms=None, **extra):
    """Attach achieved rates and roofline fractions to the benchmark's JSON entry."""
    info = {"name": name, "ms": ms, "bytes": bytes_moved, "flops": flops}
    if bytes_moved:
        gbps = bytes_moved / (ms * 1e-3) / 1e9
        info.update(gbps=gbps, frac_bandwidth=gbps / roofline["copy_gbps"])
    if flops:
        tflops = flops / (ms * 1e-3) / 1e12
        info.update(tflops=tflops, frac_gemm=tflops / roofline["gemm_tflops"])
    if baseline_ms is not None:
        info.update(baseline_ms=baseline_ms, speedup_vs_baseline=baseline_ms / ms)
    info.update(extra)
    info["roofline"] = roofline
    benchmark.extra_info.update(info)
    return info
