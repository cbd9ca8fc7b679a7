"""The linear kernel's tiles on GPUs with less shared memory than the H100/H200's 227 KiB.

`gemm.linear_config` sizes its pipelines within the shared memory a program may use on the device
(`gemm.shared_memory`): on an sm_89 GPU (RTX 4090, L40S, L4: 99 KiB), the H200's decode tiles (up
to 160 KiB in flight) would not launch. Checked two ways on any machine: the tiles' pipeline bytes
by the configuration's own arithmetic, and the shared memory Triton allocates when it compiles
those tiles for sm_89 (`perf.sm90_resources.small_smem_linear_reports`, in a process of its own:
the suite runs kernels under the interpreter, which cannot compile).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest
import torch

from rlt_kernels import gemm
from rlt_kernels.fp8 import FP8_DTYPE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SM89 = 99 * 1024
WEIGHTS = [(6144, 2048, None), (2048, 2048, None), (11264, 2048, "swiglu"), (2048, 5632, None), (49152, 2048, None),
           (15840, 5280, None), (5280, 5280, None), (35840, 5280, "swiglu"), (5280, 17920, None)]
FORMS = [(torch.bfloat16, None), (torch.bfloat16, FP8_DTYPE), (FP8_DTYPE, None), (torch.float16, None)]


def pipeline_bytes(cfg: gemm.LinearConfig, dtype, weight_dtype, activation) -> int:
    w_elem = (weight_dtype or dtype).itemsize
    acc = 2 if activation == "swiglu" else 1
    return cfg.num_stages * (cfg.block_m * dtype.itemsize + acc * cfg.block_n * w_elem) * cfg.block_k


@pytest.mark.parametrize("tma", [False, True])  # sm_80/86/89, and sm_120 (TMA, 99 KiB)
def test_tiles_fit_a_99_kib_gpu_and_keep_their_k_plan(tma):
    for (n, k, act), (dtype, wdt), rows in itertools.product(WEIGHTS, FORMS, (1, 16, 17, 64, 65, 256, 513, 2048)):
        small = gemm.linear_config(n, k, dtype, act, rows, wdt, tma, smem=SM89)
        assert pipeline_bytes(small, dtype, wdt, act) <= SM89, (n, k, act, dtype, wdt, rows, small)
        h200 = gemm.linear_config(n, k, dtype, act, rows, wdt, tma)
        assert small.k_bounds(k) == h200.k_bounds(k), (n, k, rows, small, h200)  # the same bits
        assert gemm.linear_config(n, k, dtype, act, rows, wdt, tma, smem=gemm.SM_SHARED_BYTES) == h200


def test_tiles_compiled_for_sm89_fit_its_shared_memory():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import json; from perf import sm90_resources as s; "
            "print(json.dumps(s.small_smem_linear_reports(rows=(1, 64, 2048))))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "GPUTarget" in proc.stderr:
        pytest.skip("this Triton cannot compile for a target without its GPU")
    assert proc.returncode == 0, proc.stderr[-2000:]
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    over = {name: got for name, got in reports.items() if not isinstance(got, int) or got > SM89}
    assert len(reports) == 48 and not over, over
