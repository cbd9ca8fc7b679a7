"""The context length is sized against the device before anything is allocated.

A config's `max_position_embeddings` drives max_model_len, hence the fp32 RoPE table
[max_model_len, head_dim] and the int32 block tables [planes, slots, max_model_len / block_size].
A context the device cannot hold must fail at `LLM(...)` with a ConfigError naming the field and
the largest max_model_len that fits, and that suggestion must itself load.
"""

import json

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.cache import memory
from rlt_runtime.errors import ConfigError
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.configs import config_to_dict
from rlt_runtime.models.presets import preset_config, preset_weights

SLOTS = 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """An ouro-tiny checkpoint directory, its config dict and its fp32 weight bytes."""
    path = tmp_path_factory.mktemp("ouro-tiny")
    cfg = preset_config("ouro-tiny")
    weights = dict(preset_weights(cfg, seed=0))
    save_checkpoint(str(path), cfg, weights)
    return path, config_to_dict(cfg), sum(t.numel() * 4 for t in weights.values())


def _with_context(checkpoint, context):
    path, data, _ = checkpoint
    (path / "config.json").write_text(json.dumps({**data, "max_position_embeddings": context}))
    return str(path)


def test_an_int32_context_does_not_fit_any_device(checkpoint):
    """2**31 - 1 positions: a 128 GiB RoPE table alone at head_dim 16; refused before allocating."""
    with pytest.raises(ConfigError) as err:
        LLM(_with_context(checkpoint, 2**31 - 1), dtype="float32", max_num_seqs=SLOTS)
    message = str(err.value)
    assert "max_model_len = 2147483647" in message and "'max_position_embeddings'" in message, message
    assert "set max_model_len to at most" in message, message


def test_the_suggested_max_model_len_is_the_largest_that_fits(checkpoint, monkeypatch):
    _, _, weights_bytes = checkpoint
    free = weights_bytes + memory.RESERVE_BYTES + (3 << 20)
    monkeypatch.setattr(memory, "available_bytes", lambda device: free)
    model = _with_context(checkpoint, 1 << 20)
    with pytest.raises(ConfigError) as err:
        LLM(model, dtype="float32", max_num_seqs=SLOTS)
    message = str(err.value)
    assert "'max_position_embeddings'" in message and "kept in reserve" in message, message
    fits = int(message.split("set max_model_len to at most ")[1].split()[0])
    assert 0 < fits < 1 << 20 and fits % 16 == 0

    llm = LLM(model, dtype="float32", max_num_seqs=SLOTS, max_model_len=fits)
    runner = llm.engine.executor.worker.runner
    tables = runner.cos_sin.nbytes + runner.kv.block_tables.nbytes
    layout = llm.engine.layout
    estimate = memory.context_table_bytes(fits, head_dim=16, num_planes=layout.num_planes, num_slots=SLOTS,
                                          block_size=16)
    assert estimate == tables + (memory.ROPE_BUILD_PEAK - 1) * runner.cos_sin.nbytes
    assert estimate <= free - weights_bytes - memory.RESERVE_BYTES
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2

    with pytest.raises(ConfigError, match=rf"max_model_len = {fits + 16} \(the max_model_len option\)"):
        LLM(model, dtype="float32", max_num_seqs=SLOTS, max_model_len=fits + 16)


def test_available_bytes_reads_the_host():
    free = memory.available_bytes(torch.device("cpu"))
    with open("/proc/meminfo", encoding="ascii") as f:
        total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    assert 0 < free <= total


@pytest.mark.gpu
def test_available_bytes_counts_the_allocators_cache():
    """Memory this process freed into PyTorch's cache is available (mem_get_info alone misses it)."""
    device = torch.device("cuda")
    before = memory.available_bytes(device)
    block = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    during = memory.available_bytes(device)
    del block
    after = memory.available_bytes(device)
    assert during <= before - (1 << 30) + (64 << 20)
    assert abs(after - before) < 64 << 20
    assert after <= torch.cuda.get_device_properties(device).total_memory
