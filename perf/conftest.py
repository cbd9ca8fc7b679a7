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


def cuda_time_ms(fn, warmup: int = 5, iters: int = 50) -> float:
    """Median CUDA-event time of fn() in milliseconds (graph-free, synchronised)."""
    from perf.roofline import _time_ms

    return _time_ms(fn, warmup=warmup, iters=iters)


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
