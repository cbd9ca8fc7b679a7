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


def _patch_language_once_per_launch() -> None:
    """Under TRITON_INTERPRET=1, Triton re-patches its whole language module (an `inspect.getmembers`
    scan of tl, tl.tensor, tl.math) on every call of a @triton.jit helper inside a kernel, once per
    program: about 40% of an interpreted engine test. The launch has already patched the same
    module objects and restores them when it ends, so here a launch patches both modules a helper
    may see (tl and tl.core) and a helper called while it runs skips the redundant patch. Nothing
    changes if the interpreter's internals differ from what this expects."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    patch, empty_scope = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "_LangPatchScope", None)
    launch = getattr(getattr(interpreter, "GridExecutor", None), "__call__", None)
    if patch is None or empty_scope is None or launch is None or getattr(launch, "once_per_launch", False):
        return
    running = []

    def launch_patching_once(self, *args, **kwargs):
        running.append(False)  # the launch's own patch is next, then its programs' helper calls
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    class EveryLanguageModule:  # what `_patch_lang` reads of a function: its globals' tl and tl.core
        __globals__ = {"tl": interpreter.tl, "core": interpreter.tl.core}

    def patch_once(fn):
        if running and running[-1]:  # a helper called by a running kernel: the launch's patch is in place
            return empty_scope()
        if not running:
            return patch(fn)
        running[-1] = True
        return patch(EveryLanguageModule)  # tl.core too: helpers of triton.language.standard use it

    launch_patching_once.once_per_launch = True
    interpreter.GridExecutor.__call__ = launch_patching_once
    interpreter._patch_lang = patch_once


if os.environ.get("TRITON_INTERPRET") == "1":
    _patch_language_once_per_launch()

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
settings.load_profile("ci")


def pytest_addoption(parser):
    parser.addoption("--device-kernel-tests", action="store_true",
                     help="only the tests that take the `device` fixture and carry no gpu marker: on a CUDA "
                          "machine, the CPU suite's kernel tests on the GPU (perf/run_gpu.sh device-tests)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--device-kernel-tests"):
        chosen = [item for item in items if "device" in getattr(item, "fixturenames", ()) and "gpu" not in item.keywords]
        kept = set(chosen)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = chosen
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
