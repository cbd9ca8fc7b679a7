"""The engine with attention_backend="flash" (FlashAttention stand-ins on the CPU) against the
fp64 dense reference, and the configurations the flash backend refuses."""

from __future__ import annotations

import pytest
import torch

import flash_standin
from rlt_kernels import flash
from rlt_kernels._triton import interpreter_active
from rlt_runtime import LLM, SamplingParams
from rlt_runtime.cache.layout import make_layout
from rlt_runtime.errors import ConfigError
from rlt_runtime.executor.ops import check_flash_setup
from rlt_runtime.models.presets import preset_config
from test_engine_reference import PROMPTS, SEED, check

pytestmark = pytest.mark.skipif(not interpreter_active(), reason="CPU runs use the Triton interpreter for the other ops")


@pytest.fixture
def standin(request, monkeypatch):
    """FlashAttention 2 or 3 (this fixture's parameter, "fa3" by default) replaced by its pure-torch stand-in."""
    version = getattr(request, "param", "fa3")
    flash_standin.install(monkeypatch, version)
    yield version
    monkeypatch.undo()
    flash._flash_module.cache_clear()


def flash_llm(preset, version, **options):
    block_size = 256 if version == "fa2" else 16
    return LLM(preset, dtype="float32", device="cpu", seed=0, attention_backend="flash", batch_invariant=False,
               block_size=block_size, max_num_seqs=4, **options)


@pytest.mark.parametrize("standin,preset,options,mode,threshold,ref_layout", [
    pytest.param("fa2", "ouro-tiny", {"exit_mode": "ouro"}, "ouro", 0.55, None,
                 marks=pytest.mark.slow),  # ~25 s; FA2's calls stay in the default run in tests/kernels/test_flash.py
    pytest.param("fa3", "ouro-tiny", {"exit_mode": "ouro"}, "ouro", 0.55, None,
                 marks=pytest.mark.slow),  # ~27 s; FA3's calls stay in the default run in tests/kernels/test_flash.py
    pytest.param("fa3", "ouro-tiny", {"exit_mode": "ouro", "kv_layout": "shared"}, "ouro", 0.55, "shared",
                 marks=pytest.mark.slow),  # ~30 s: a prefill step per prompt token
    pytest.param("fa2", "huginn-tiny", {"exit_mode": "latent-diff", "exit_criterion_threshold": 1.2}, "latent-diff", 1.2,
                 "full", marks=pytest.mark.slow),  # ~30 s; Huginn's Triton path runs unmarked in test_triton_path
    pytest.param("fa3", "huginn-tiny", {"exit_mode": "fixed", "kv_layout": "compress-s2"}, "fixed", None,
                 "compress-s2", marks=pytest.mark.slow),  # ~50 s
], indirect=["standin"])
def test_flash_engine_matches_dense_reference(standin, preset, options, mode, threshold, ref_layout):
    """Greedy tokens and exit depths equal the fp64 reference (LAST_EXITED through copy reads)."""
    llm = flash_llm(preset, standin, **options)
    assert llm.engine.executor.worker.ops.paged_attention is flash.paged_attention
    assert llm.engine.layout.copy_reads == (llm.engine.layout.core_planes > 1)
    params = SamplingParams(max_tokens=5, temperature=0, exit_threshold=threshold if preset == "ouro-tiny" else 1.0,
                            ignore_eos=True, seed=SEED)
    # Plane-sharing layouts prefill position by position (a step per prompt token): shorter prompts.
    prompts = [PROMPTS[1], PROMPTS[2]] if llm.engine.layout.shares_planes else PROMPTS[:3]
    outs = check(llm, preset, prompts, params, mode=mode, threshold=threshold, layout=ref_layout)
    if llm.engine.layout.copy_reads:  # the exits must exercise reads of tokens that left at different loops
        assert len({d for o in outs for d in o.outputs[0].exit_depths[1:]}) > 1


def test_layouts_sharing_planes_across_loops_are_refused(standin):
    with pytest.raises(ConfigError, match="attention_backend='flash'.*kv_layout='compress-s4'"):
        flash_llm("huginn-tiny", standin, kv_layout="compress-s4")


@pytest.mark.parametrize("standin", ["fa2"], indirect=True)
def test_fa2_block_size_is_checked_up_front(standin):
    with pytest.raises(ConfigError, match="block_size"):
        LLM("ouro-tiny", device="cpu", attention_backend="flash", batch_invariant=False, block_size=16)


def test_flash_needs_half_precision_on_cuda():
    layout = make_layout(preset_config("ouro-tiny"), "last_exited", 4, copy_reads=True)
    check_flash_setup(layout, torch.device("cuda"), torch.bfloat16, 16)
    with pytest.raises(ConfigError, match="dtype"):
        check_flash_setup(layout, torch.device("cuda"), torch.float32, 16)


@pytest.mark.parametrize("options,match", [
    ({"batch_invariant": True}, "batch_invariant"),
    ({"batch_invariant": False, "last_exited_reads": "indirect"}, "last_exited_reads='copy'"),
])
def test_static_flash_conflicts(options, match):
    with pytest.raises(ConfigError, match=match):
        LLM("ouro-tiny", device="cpu", attention_backend="flash", **options)
