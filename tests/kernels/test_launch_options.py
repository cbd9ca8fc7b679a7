"""Every Triton launch in rlt_kernels states its FMA contraction (`enable_fp_fusion`).

Triton contracts a * b + c into one FMA unless a launch says otherwise up to 3.9, and 3.10 turns
that default off. The kernels' bits (batch invariance is checked bit for bit against measured GPU
runs) and speed were established with contraction on, except where a kernel rounds exactly as its
torch reference (off): a launch that leaves it to the default would change its bits with the Triton
release.
"""

from __future__ import annotations

import ast
import pathlib

import rlt_kernels

PACKAGE = pathlib.Path(rlt_kernels.__file__).parent


def _launches(path: pathlib.Path):
    """(line, keyword names) of every `kernel[grid](...)` call in a module."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            yield node.lineno, {k.arg for k in node.keywords}


def test_every_launch_states_fma_contraction():
    launches = [(path.name, line, names) for path in sorted(PACKAGE.glob("*.py")) for line, names in _launches(path)]
    assert len(launches) >= 17  # every kernel family launches at least once
    missing = [f"{name}:{line}" for name, line, names in launches if "enable_fp_fusion" not in names]
    assert not missing, f"launches without enable_fp_fusion: {missing}"
