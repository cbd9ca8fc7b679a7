"""Test configuration: CPU runs Triton kernels under the interpreter; `gpu` tests need CUDA."""

import gc
import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    # Must be set before triton is imported anywhere.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

if not HAS_CUDA:
    # Tiny CPU workloads: intra-op threads only add contention on the 2-core CI machine.
    torch.set_num_threads(1)
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.load_profile("ci")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def thawed_heap():
    """Commands that serve one engine freeze the collector's heap once it has started
    (`engine.heap.freeze_heap`); tests run them in this process, so each test thaws it after."""
    yield
    gc.unfreeze()


@pytest.fixture
def device():
    """The device kernel tests run on: CUDA when present, else CPU under the interpreter."""
    return torch.device("cuda" if HAS_CUDA else "cpu")
