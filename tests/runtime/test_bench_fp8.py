"""perf/bench_fp8's FP8 floors: the layers' weights at one byte a parameter, the rest in bf16."""

import math

from perf.bench_engine import floor_ms, weight_bytes_per_step
from perf.bench_fp8 import fp8_weight_bytes_per_step
from rlt_runtime.models.configs import hf_weight_shapes
from rlt_runtime.models.presets import preset_config


def test_fp8_weight_bytes_halve_the_layers_only():
    cfg = preset_config("ouro-1.4b")
    shapes = hf_weight_shapes(cfg)
    layers = sum(math.prod(s) for n, s in shapes.items() if ".layers." in n and len(s) == 2)
    head = math.prod(shapes["lm_head.weight"])
    bf16 = weight_bytes_per_step(cfg, 4)
    fp8 = fp8_weight_bytes_per_step(cfg, 4)
    assert bf16 - fp8 == 4 * layers  # four loops re-read the layers, one byte saved a parameter each
    assert fp8 > 4 * layers + 2 * head - 4 * 10**6  # the head (and the norms) stay bf16
    roof = {"copy_gbps": 4000.0, "gemm_tflops": 700.0}
    assert floor_ms(cfg, 4, 1, roof, weight_bytes=fp8) < 0.6 * floor_ms(cfg, 4, 1, roof)
    assert floor_ms(cfg, 4, 256, roof, weight_bytes=fp8, kv_elem_bytes=1) < floor_ms(cfg, 4, 256, roof)
