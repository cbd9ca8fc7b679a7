"""Sleep mode (executor/sleep.py, `LLM.sleep` / `wake_up`): while asleep every weight and K/V
storage holds no memory; level 1 wakes up to the same outputs bit for bit, level 2 to weights that
`update_weights` refills (then the outputs of an engine built with them); tensor-parallel ranks and
data-parallel replicas sleep too; requests, weight updates and bad calls are refused by name."""

from __future__ import annotations

import pytest
import torch

from outputs_of import outputs_of
from rlt_runtime import LLM, ConfigError, RequestError, SamplingParams
from rlt_runtime.config import EngineConfig
from rlt_runtime.engine.data_parallel import DataParallelEngine
from rlt_runtime.executor.sleep import kv_tensors
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.models.tensor_parallel import weight_tensors
from rlt_runtime.models.tokenizer import builtin_tokenizer

OPTIONS = dict(dtype="float32", device="cpu", max_num_seqs=4, block_size=16, seed=0, enable_sleep_mode=True)
SHARED = list(range(3, 35))
PROMPTS = [SHARED + [40, 41], list(range(60, 75)), SHARED + [50]]
PARAMS = [SamplingParams(max_tokens=6, temperature=0, seed=2, logprobs=2, ignore_eos=True),
          SamplingParams(max_tokens=6, temperature=1.0, seed=7, ignore_eos=True),
          SamplingParams(max_tokens=5, temperature=0.8, seed=3, ignore_eos=True)]


def _results(llm) -> list:
    """PROMPTS under PARAMS on an LLM, or on a front end (stepped here)."""
    return outputs_of(llm, PROMPTS, PARAMS)


def _device_tensors(llm) -> list[torch.Tensor]:
    worker = llm.engine.executor.worker
    return weight_tensors(worker.model) + kv_tensors(worker.runner.kv)


@pytest.mark.parametrize("model,quantization", [("ouro-tiny", None), ("ouro-tiny", "w8a8_fp8"), ("huginn-tiny", None)])
def test_level_1_gives_the_memory_back_and_wakes_to_the_same_outputs(model, quantization):
    llm = LLM(model, **dict(OPTIONS, quantization=quantization), kv_cache_dtype="fp8")
    before = _results(llm)
    tensors = _device_tensors(llm)
    held = sum(t.untyped_storage().nbytes() for t in {t.untyped_storage().data_ptr(): t for t in tensors}.values())
    assert llm.sleep(level=1) == held
    assert llm.is_sleeping() and all(t.untyped_storage().nbytes() == 0 for t in tensors)
    runner = llm.engine.executor.worker.runner  # the staged step inputs are zero, as at startup (the graphs
    assert not runner.pre_in.dev.any() and not runner.dec_in.dev.any()  # captured at wake-up run on them)
    llm.wake_up()
    assert not llm.is_sleeping()
    assert _results(llm) == before


def test_the_prefix_cache_is_reset_by_sleep():
    llm = LLM("ouro-tiny", **OPTIONS)
    _results(llm)
    hits = llm.stats()["prefix_cache_hits"]
    llm.sleep()
    llm.wake_up()
    llm.generate([SHARED + [99]], PARAMS[0], use_tqdm=False)  # the K/V it cached came back as zeros: not served
    assert llm.stats()["prefix_cache_hits"] == hits


def test_level_2_then_new_weights_in_parts(tmp_path):
    cfg = preset_config("ouro-tiny")
    new = list(preset_weights(cfg, seed=1, dtype=torch.float32))
    save_checkpoint(str(tmp_path), cfg, dict(new), tokenizer=builtin_tokenizer(cfg))
    llm = LLM("ouro-tiny", **OPTIONS)
    before = _results(llm)
    llm.sleep(level=2)
    with pytest.raises(RequestError, match=r"wake_up\(tags=\['weights'\]\)"):
        llm.update_weights(new)
    llm.wake_up(tags=["weights"])
    assert all(not t.any() for t in weight_tensors(llm.engine.executor.worker.model))  # level 2 kept nothing
    with pytest.raises(RequestError, match="asleep \\(kv_cache given back\\)"):
        llm.generate(PROMPTS[:1], PARAMS[0], use_tqdm=False)
    llm.update_weights(new[::2])
    llm.update_weights(new[1::2])
    llm.wake_up(tags=["kv_cache"])
    want = _results(LLM(str(tmp_path), **OPTIONS))
    assert want != before and _results(llm) == want


def test_bad_calls_are_refused_by_name():
    with pytest.raises(RequestError, match="sleep mode is off: build the engine with enable_sleep_mode=True"):
        LLM("ouro-tiny", **dict(OPTIONS, enable_sleep_mode=False)).sleep()
    with pytest.raises(ConfigError, match="enable_sleep_mode must be False with execution_mode 'compile'"):
        EngineConfig(execution_mode="compile", enable_sleep_mode=True).validate_static()
    llm = LLM("ouro-tiny", **OPTIONS)
    with pytest.raises(RequestError, match="sleep level must be 1 .* or 2 .*got 3"):
        llm.sleep(level=3)
    with pytest.raises(RequestError, match=r"wake_up tags must be among \['weights', 'kv_cache'\], got \['kv'\]"):
        llm.wake_up(tags=["kv"])
    llm.engine.add_request("busy", [5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="sleep needs an idle engine"):
        llm.sleep()
    llm.engine.abort_request("busy")
    llm.sleep()
    with pytest.raises(RequestError, match="already asleep"):
        llm.sleep()
    llm.wake_up()
    llm.wake_up()  # (awake already: nothing to do)
    assert not llm.is_sleeping()
    llm.engine.check_invariants()


def test_tensor_parallel_ranks_sleep_and_wake():
    llm = LLM("ouro-tiny", tensor_parallel_size=2, **OPTIONS)
    try:
        before = _results(llm)
        assert llm.sleep(level=1) > 0
        llm.wake_up()
        assert _results(llm) == before
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("backend", ["inprocess", "process"])
def test_data_parallel_replicas_sleep_and_wake(backend):
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend=backend, **OPTIONS)
    try:
        want = _results(LLM("ouro-tiny", **OPTIONS))
        assert engine.sleep(level=1) > 0 and engine.is_sleeping()
        with pytest.raises(RequestError, match="asleep"):
            engine.add_request("r", [5, 6, 7], SamplingParams(max_tokens=2))
        engine.wake_up()
        assert not engine.is_sleeping()
        assert _results(engine) == want
    finally:
        engine.shutdown()


def test_weights_mapped_from_the_checkpoint_file(tmp_path):
    """A CPU engine reads some weights in place from the checkpoint's file mapping (storages that
    cannot be resized): they stay at sleep, and level 2 still leaves every weight zero."""
    cfg = preset_config("ouro-tiny")
    save_checkpoint(str(tmp_path), cfg, dict(preset_weights(cfg, seed=1, dtype=torch.float32)),
                    tokenizer=builtin_tokenizer(cfg))
    llm = LLM(str(tmp_path), **OPTIONS)
    weights = weight_tensors(llm.engine.executor.worker.model)
    assert any(not t.untyped_storage().resizable() for t in weights)  # (what this test is about)
    before = _results(llm)
    llm.sleep(level=1)
    llm.wake_up()
    assert _results(llm) == before
    llm.sleep(level=2)
    llm.wake_up()
    assert all(not t.any() for t in weights)
