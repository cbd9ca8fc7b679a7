"""LLM.update_weights (models/weight_update.py) and reset_prefix_cache: any part of a checkpoint
written into a loaded model gives, bit for bit, the model a load of the updated checkpoint builds
(every family, quantization and tensor-parallel rank); after new weights an engine gives what an
engine built with them gives (greedy and seeded sampling, logprobs), with its weight tensors still
at their addresses (what captured CUDA graphs read); the prefix cache no longer serves the old
weights' K/V; tensor-parallel ranks and data-parallel replicas (in process and in processes) take
the update too; bad sets change nothing and busy engines are refused, by name."""

from __future__ import annotations

import random

import pytest
import torch

from outputs_of import outputs_of
from rlt_runtime import LLM, RequestError, SamplingParams
from rlt_runtime.cache.block_pool import BlockPool
from rlt_runtime.engine.data_parallel import DataParallelEngine
from rlt_runtime.errors import CheckpointError
from rlt_runtime.models import build_model
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.models.tensor_parallel import TensorParallel, shard_model, weight_tensors
from rlt_runtime.models.tokenizer import builtin_tokenizer
from rlt_runtime.models.weight_update import write_weights

OPTIONS = dict(dtype="float32", device="cpu", max_num_seqs=4, block_size=16)
SHARED = list(range(3, 35))  # two full 16-token blocks: the prefix cache keeps them
PROMPTS = [SHARED + [40, 41, 42], list(range(60, 75)), SHARED + [50]]
PARAMS = [SamplingParams(max_tokens=6, temperature=0, seed=2, logprobs=2, ignore_eos=True),  # (Huginn's initial
          # state of an unseeded request depends on its arrival number: every request here is seeded)
          SamplingParams(max_tokens=6, temperature=1.0, seed=7, logprobs=1, ignore_eos=True),
          SamplingParams(max_tokens=5, temperature=0.8, seed=3, ignore_eos=True)]


def _new_weights(model: str, seed: int = 1):
    return dict(preset_weights(preset_config(model), seed=seed, dtype=torch.float32))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """built(model): a checkpoint of `_new_weights(model)`, for an engine built with them (same
    engine seed as the updated one: Huginn's initial states and unseeded keys come from it)."""
    paths = {}

    def get(model: str) -> str:
        if model not in paths:
            cfg = preset_config(model)
            paths[model] = str(tmp_path_factory.mktemp(model))
            save_checkpoint(paths[model], cfg, _new_weights(model), tokenizer=builtin_tokenizer(cfg))
        return paths[model]

    return get


def _results(llm) -> list:
    """PROMPTS under PARAMS on an LLM, or on a front end (stepped here)."""
    return outputs_of(llm, PROMPTS, PARAMS)


def _loaded(model: str, weights: dict, quantization, rank, dtype=torch.bfloat16):
    """The model `weights` load into (the worker's way: load, then cut rank `rank` of 2; None: no
    tensor parallelism)."""
    loaded = build_model(preset_config(model), None, "cpu", dtype, quantization)
    loaded.load_weights(weights.items())
    if rank is not None:
        shard_model(loaded, TensorParallel(rank, 2))
    return loaded


def _subsets(names: list, seed: int):
    """Parts of a checkpoint: every name, one name at a time (so each fused part is written alone),
    and random halves."""
    rng = random.Random(seed)
    yield names
    for name in names:
        yield [name]
    for _ in range(3):
        yield rng.sample(names, len(names) // 2)


@pytest.mark.parametrize("model,quantization", [("ouro-tiny", None), ("ouro-tiny", "fp8"), ("ouro-tiny", "w8a8_fp8"),
                                                ("huginn-tiny", None), ("huginn-tiny", "fp8")])
@pytest.mark.parametrize("rank", [None, 0, 1])
def test_any_part_written_gives_the_model_its_load_builds(model, quantization, rank):
    g = torch.Generator().manual_seed(5)
    old = _new_weights(model, seed=0)  # (the presets' norms are ones and biases zeros: noise makes every tensor new)
    new = {name: w + 0.01 * torch.randn(w.shape, generator=g) for name, w in _new_weights(model, seed=1).items()}
    names = list(new)
    for part in _subsets(names, seed=len(names)):
        live = _loaded(model, old, quantization, rank)
        addresses = [t.data_ptr() for t in weight_tensors(live)]
        write_weights(live, [(name, new[name]) for name in part])
        want = _loaded(model, {name: new[name] if name in part else w for name, w in old.items()}, quantization, rank)
        got, expected = weight_tensors(live), weight_tensors(want)
        assert [t.shape for t in got] == [t.shape for t in expected]
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, expected)), part
        assert [t.data_ptr() for t in got] == addresses  # written in place


def test_refused_sets_change_nothing():
    live = _loaded("ouro-tiny", _new_weights("ouro-tiny", seed=0), "fp8", 1)
    before = [t.clone() for t in weight_tensors(live)]
    new = _new_weights("ouro-tiny", seed=1)
    norm = ("model.norm.weight", new["model.norm.weight"])
    bad = {"unexpected tensor 'model.layers.9.mlp.up_proj.weight' \\(not in a ouro checkpoint\\)":
           [norm, ("model.layers.9.mlp.up_proj.weight", new["model.layers.0.mlp.up_proj.weight"])],
           "tensor 'model.norm.weight' is given twice": [norm, norm],
           "tensor 'lm_head.weight' has shape \\[319, 64\\], expected \\[320, 64\\]":
           [norm, ("lm_head.weight", new["lm_head.weight"][:-1])]}
    for message, weights in bad.items():
        with pytest.raises(CheckpointError, match=message):
            write_weights(live, weights)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(weight_tensors(live), before))


@pytest.mark.parametrize("model,quantization", [("ouro-tiny", None), ("huginn-tiny", None), ("ouro-tiny", "fp8")])
def test_new_weights_give_what_an_engine_built_with_them_gives(built, model, quantization):
    opts = dict(OPTIONS, quantization=quantization) if quantization else OPTIONS
    llm = LLM(model, **opts)
    before = _results(llm)  # also fills the prefix cache with the old weights' K/V
    live = llm.engine.executor.worker.model
    addresses = [t.data_ptr() for t in weight_tensors(live)]
    llm.update_weights(_new_weights(model).items())
    want = _results(LLM(built(model), **opts))
    assert want != before  # new weights change the outputs: the check has teeth
    assert _results(llm) == want
    assert [t.data_ptr() for t in weight_tensors(live)] == addresses  # written in place


def test_the_prefix_cache_is_reset():
    llm = LLM("ouro-tiny", **OPTIONS)
    _results(llm)
    llm.generate([SHARED + [99]], PARAMS[0], use_tqdm=False)
    hits = llm.stats()["prefix_cache_hits"]
    assert hits > 0  # the shared blocks are cached
    llm.update_weights(_new_weights("ouro-tiny").items())
    llm.generate([SHARED + [98]], PARAMS[0], use_tqdm=False)
    assert llm.stats()["prefix_cache_hits"] == hits  # nothing cached before the update is served
    assert llm.reset_prefix_cache() > 0 and llm.reset_prefix_cache() == 0
    llm.engine.check_invariants()


def test_a_part_at_a_time_and_busy_engines(built):
    """Layer by layer (as a trainer that gathers one module at a time sends them) and refused while busy."""
    llm = LLM("ouro-tiny", **OPTIONS)
    weights = _new_weights("ouro-tiny")
    with pytest.raises(CheckpointError, match="tensor .lm_head.weight. has shape \\[319, 64\\], expected \\[320, 64\\]"):
        llm.update_weights([("lm_head.weight", weights["lm_head.weight"][:-1])])
    llm.engine.add_request("busy", [5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(RequestError, match="idle engine"):
        llm.update_weights(weights.items())
    llm.engine.abort_request("busy")
    first = [name for name in weights if not name.startswith("model.layers.")]
    llm.update_weights([(name, weights[name]) for name in first])
    assert _results(llm) != _results(LLM(built("ouro-tiny"), **OPTIONS))  # (the layers are still the old ones)
    layers = preset_config("ouro-tiny").num_hidden_layers
    for i in range(layers):
        llm.update_weights([(n, w) for n, w in weights.items() if n.startswith(f"model.layers.{i}.")])
    assert _results(llm) == _results(LLM(built("ouro-tiny"), **OPTIONS))


def test_tensor_parallel_ranks_take_their_shards(built):
    llm = LLM("ouro-tiny", tensor_parallel_size=2, seed=0, **dict(OPTIONS, max_num_seqs=4))
    try:
        weights = list(_new_weights("ouro-tiny").items())
        llm.update_weights(weights[::2])  # in two parts
        llm.update_weights(weights[1::2])
        one = LLM(built("ouro-tiny"), tensor_parallel_size=2, **OPTIONS)
        try:
            assert _results(llm) == _results(one)
        finally:
            one.engine.shutdown()
    finally:
        llm.engine.shutdown()


@pytest.mark.parametrize("backend", ["inprocess", "process"])
def test_data_parallel_replicas_take_the_update(built, backend):
    engine = DataParallelEngine("ouro-tiny", data_parallel_size=2, backend=backend, seed=0, **OPTIONS)
    try:
        engine.update_weights(_new_weights("ouro-tiny").items())
        assert engine.reset_prefix_cache() == 0  # (the update reset it)
        assert _results(engine) == _results(LLM(built("ouro-tiny"), **OPTIONS))
    finally:
        engine.shutdown()


def test_reset_drops_idle_entries_and_frees_referenced_ones_on_release():
    pool = BlockPool(6)
    blocks = pool.allocate(4)
    pool.publish(11, (blocks[0], blocks[1]))
    pool.publish(12, (blocks[2], blocks[3]))
    pool.release(blocks[:2])  # entry 11 idle, entry 12 still referenced
    assert pool.reset_prefix_cache() == 2
    pool.check_invariant()
    assert pool.lookup(11) is None and pool.lookup(12) is None
    pool.release(blocks[2:])
    pool.check_invariant()
    assert pool.num_free == 6 and pool.allocate(6) is not None
