"""`pytest --device-kernel-tests` (perf/run_gpu.sh device-tests): the kernel tests that take the
`device` fixture and carry no gpu marker, which the GPU suite's `-m gpu` leaves out."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_option_selects_the_device_tests_without_the_gpu_marker():
    """test_widen.py has two device-fixture tests, and one that also carries the gpu marker (the
    GPU suite runs it); test_rope_paged_attention.py has gpu tests without the fixture."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--device-kernel-tests", "--co", "-q", "-p", "no:cacheprovider",
                          "tests/kernels/test_widen.py", "tests/kernels/test_rope_paged_attention.py"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    names = {i.split("::")[1].split("[")[0] for i in ids}
    assert {"test_widening_is_exact_for_every_value", "test_word_widening_is_exact_for_every_value_in_element_order",
            "test_fused_pass_gives_the_two_kernels_bits", "test_split_rows_write_their_own_key_once"} <= names, ids
    assert not any("gpu" in name for name in names), ids
