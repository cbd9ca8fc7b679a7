"""Measured ceilings of the GPU a benchmark runs on: copy bandwidth and bf16 GEMM rate.

Every benchmark reports its achieved rate as a fraction of these numbers, measured in the same
run (never datasheet values).
"""

from __future__ import annotations

import functools
import json

import torch


def _time_ms(fn, warmup: int = 3, iters: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


@functools.lru_cache(maxsize=None)
def measure(device: str = "cuda") -> dict:
    """{'copy_gbps': device-to-device copy (bytes read + written), 'gemm_tflops': bf16 8192^3}."""
    n = 1 << 30  # 1 GiB per buffer: far past L2
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    copy_ms = _time_ms(lambda: dst.copy_(src))
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    gemm_ms = _time_ms(lambda: a @ b)
    result = {
        "copy_gbps": 2 * n / (copy_ms * 1e-3) / 1e9,
        "gemm_tflops": 2 * 8192**3 / (gemm_ms * 1e-3) / 1e12,
        "gpu": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
    }
    try:
        import triton

        result["triton"] = triton.__version__
    except ImportError:
        result["triton"] = None
    return result


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
