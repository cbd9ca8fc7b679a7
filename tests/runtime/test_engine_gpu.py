"""Engine on the GPU: Triton kernels against the dense reference, bitwise mode invariance,
one host sync per step, graph lifecycle, long contexts and many requests."""

from __future__ import annotations

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.executor.profiling import count_host_syncs
from rlt_runtime.models.dense_reference import RefExit, reference_generate
from rlt_runtime.models.huginn import request_initial_state
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.stable_hash import prompt_key, sample_key
from workload import run_workload

pytestmark = pytest.mark.gpu

GPU_SHARE = 0.08  # of the device memory per engine (test workers run side by side)
PROMPTS = [list(range(5, 40)), [40, 41, 42], [100], list(range(50, 130)), list(range(5, 37)) + [7, 8]]


def engine(preset, device="cuda", **options):
    """An engine with a small share of the GPU, so test processes can share one device."""
    return LLM(preset, device=device, gpu_memory_utilization=GPU_SHARE, **options)


def outputs(llm, prompts, params, arrivals=None):
    """Run a workload with staggered arrivals; returns {index: (tokens, depths, logprobs)}."""
    work = list(zip(prompts, arrivals or [0] * len(prompts)))
    done = run_workload(llm, work, params)
    return {i: (c.token_ids, c.exit_depths,
                [(lp.logprob, tuple(sorted(lp.top.items()))) for lp in c.logprobs] if c.logprobs else None)
            for i, c in done.items()}


def max_syncs_per_step(eng, steps: int) -> int:
    return max(count_host_syncs(eng.step) for _ in range(steps))


@pytest.mark.parametrize("preset,mode,threshold", [("ouro-tiny", "ouro", 0.55), ("ouro-tiny", "ouro", 1.0),
                                                   ("huginn-tiny", "latent-diff", 1.2)])
def test_fp32_triton_engine_matches_reference(preset, mode, threshold):
    cfg = preset_config(preset)
    w = dict(preset_weights(cfg, seed=0, dtype=torch.float64))
    kw = {"exit_mode": mode}
    if cfg.family == "huginn":
        kw["exit_criterion_threshold"] = threshold
    llm = engine(preset, dtype="float32", max_num_seqs=8, **kw)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True,
                            exit_threshold=threshold if cfg.family == "ouro" else 1.0, seed=11)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    init = None
    ref_mode = mode if (cfg.family == "huginn" or threshold < 1) else "fixed"
    for p, o in zip(PROMPTS, outs):
        if cfg.family == "huginn":  # the engine's seed is 0 (the default)
            init = request_initial_state(cfg, len(p), prompt_key(0), sample_key(11, 0))
        r = reference_generate(cfg, w, p, 10, exit=RefExit(mode=ref_mode, threshold=threshold), initial_state=init)
        assert (o.outputs[0].token_ids, o.outputs[0].exit_depths) == (r.tokens, r.exit_depths)


def test_bf16_engine_tracks_the_reference():
    cfg = preset_config("ouro-tiny")
    w = dict(preset_weights(cfg, seed=0, dtype=torch.float64))
    llm = engine("ouro-tiny", dtype="bfloat16", max_num_seqs=8)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=0), use_tqdm=False)
    agree = total = 0
    for p, o in zip(PROMPTS, outs):
        r = reference_generate(cfg, w, p, 8)
        ref_lp = torch.log_softmax(r.logits[0].float(), -1)[o.outputs[0].token_ids[0]]
        assert abs(o.outputs[0].logprobs[0].logprob - float(ref_lp)) < 0.05
        for a, b in zip(o.outputs[0].token_ids, r.tokens):
            agree += a == b
            total += 1
            if a != b:
                break
    assert agree / total > 0.5


def assert_every_capture_succeeded(stats):
    """Outputs equal to eager prove nothing about a mode whose captures fell back to eager."""
    for name in ("graphs", "prefill_graphs"):
        if stats.get(name):
            assert stats[name]["failed_captures"] == 0, f"{name}: {stats[name]}"


WORK = dict(prompts=PROMPTS * 3, arrivals=[0, 0, 1, 2, 2, 3, 5, 5, 6, 9, 9, 9, 12, 14, 20])


@pytest.fixture(scope="module")
def eager_reference():
    params = SamplingParams(max_tokens=12, temperature=0.8, seed=3, exit_threshold=0.6, logprobs=2, ignore_eos=True)
    llm = engine("ouro-tiny", execution_mode="eager", async_scheduling=False, max_num_seqs=8)
    return params, outputs(llm, WORK["prompts"], params, WORK["arrivals"])


@pytest.mark.parametrize("options", [
    dict(execution_mode="graphs"),
    dict(execution_mode="graphs", async_scheduling=True),
    dict(execution_mode="eager", async_scheduling=True),
    dict(execution_mode="graphs", cuda_graph_sizes=[1, 3, 8]),
    dict(execution_mode="graphs", max_num_seqs=3),
    dict(execution_mode="graphs", prefill_chunk_size=5, async_scheduling=True),
    # torch.compile per bucket is slow: two decode buckets and two prefill token buckets (16, 32).
    dict(execution_mode="compile", cuda_graph_sizes=[4, 8], max_num_batched_tokens=32),
])
def test_modes_are_bitwise_identical(eager_reference, options):
    params, ref = eager_reference
    options = {"max_num_seqs": 8, **options}
    llm = engine("ouro-tiny", **options)
    got = outputs(llm, WORK["prompts"], params, WORK["arrivals"])
    assert got == ref
    assert_every_capture_succeeded(llm.stats())


def test_at_most_one_sync_per_step():
    llm = engine("ouro-tiny", max_num_seqs=8)
    eng = llm.engine
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"s{i}", p, SamplingParams(max_tokens=40, ignore_eos=True))
    for _ in range(6):  # admission, prefill, first decodes, pinned-buffer warm-up
        eng.step()
    # The handle's event wait is the step's one intended sync; sync debug mode flags any other.
    assert max_syncs_per_step(eng, 10) <= 1


def test_fallbacks_are_counted_and_identical(eager_reference):
    params, ref = eager_reference
    llm = engine("ouro-tiny", max_num_seqs=8, cuda_graph_sizes=[1, 2])
    got = outputs(llm, WORK["prompts"], params, WORK["arrivals"])
    st = llm.stats()["graphs"]
    assert got == ref and st["fallbacks"] > 0 and st["replays"] > 0


def test_failed_capture_falls_back_cleanly(eager_reference, monkeypatch):
    params, ref = eager_reference
    from rlt_runtime.executor import model_runner

    original = model_runner.ModelRunner.decode_program

    def flaky(self, b, *args, **kwargs):
        if torch.cuda.is_current_stream_capturing() and b == 4:
            raise RuntimeError("injected capture failure")
        return original(self, b, *args, **kwargs)

    monkeypatch.setattr(model_runner.ModelRunner, "decode_program", flaky)
    llm = engine("ouro-tiny", max_num_seqs=8, cuda_graph_sizes=[1, 2, 4, 8])
    assert llm.stats()["graphs"]["failed_captures"] >= 1
    assert outputs(llm, WORK["prompts"], params, WORK["arrivals"]) == ref


def test_two_engines_and_a_non_default_device(eager_reference):
    params, ref = eager_reference
    a = engine("ouro-tiny", max_num_seqs=8)
    dev = "cuda:1" if torch.cuda.device_count() > 1 else "cuda:0"
    b = engine("ouro-tiny", device=dev, max_num_seqs=8)
    assert outputs(a, WORK["prompts"], params, WORK["arrivals"]) == ref
    assert outputs(b, WORK["prompts"], params, WORK["arrivals"]) == ref


def test_long_context_and_many_requests():
    llm = engine("ouro-tiny", max_num_seqs=64)
    long_prompt = [(i * 7) % 300 + 3 for i in range(llm.engine.max_model_len - 64)]
    outs = llm.generate([long_prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    assert len(outs[0].outputs[0].token_ids) == 16
    many = [[(i * 13 + j) % 300 + 3 for j in range(1 + i % 40)] for i in range(300)]
    outs = llm.generate(many, SamplingParams(max_tokens=8, exit_threshold=0.6), use_tqdm=False)
    assert all(o.finished for o in outs)
    llm.engine.check_invariants()
    assert llm.engine.kv.pool.num_free == llm.engine.kv.pool.num_blocks


@pytest.mark.parametrize("options", [
    dict(execution_mode="eager", async_scheduling=False),
    dict(execution_mode="graphs", async_scheduling=False),
    dict(execution_mode="graphs", async_scheduling=True),
])
@pytest.mark.parametrize("k,d,policy", [(2, 2, "fixed"), (4, 1, "adaptive")])
def test_greedy_speculation_matches_plain_decoding_on_gpu(eager_reference, options, k, d, policy):
    _, ref = eager_reference
    params = SamplingParams(max_tokens=12, temperature=0, exit_threshold=0.6, ignore_eos=True)
    plain = outputs(engine("ouro-tiny", max_num_seqs=8, execution_mode="eager"), WORK["prompts"], params,
                    WORK["arrivals"])
    llm = engine("ouro-tiny", max_num_seqs=8,
              speculative_config={"num_speculative_tokens": k, "draft_loops": d, "draft_policy": policy}, **options)
    assert outputs(llm, WORK["prompts"], params, WORK["arrivals"]) == plain
    st = llm.stats()["speculative"]
    assert st["rounds"] > 0
    if options["execution_mode"] == "graphs":
        assert st["graphs"]["fallbacks"] == 0 and st["graphs"]["replays"] > 0


def test_greedy_speculation_in_compile_mode_matches_plain_decoding():
    """torch.compile round programs (one row bucket, one draft, greedy and sampling: compiling
    every program takes minutes)."""
    params = SamplingParams(max_tokens=12, temperature=0, exit_threshold=0.6, ignore_eos=True)
    plain = outputs(engine("ouro-tiny", max_num_seqs=8, execution_mode="eager"), WORK["prompts"], params,
                    WORK["arrivals"])
    llm = engine("ouro-tiny", max_num_seqs=8, execution_mode="compile", cuda_graph_sizes=[8],
                 max_num_batched_tokens=32,
                 speculative_config={"num_speculative_tokens": 1, "draft_loops": 2, "draft_policy": "fixed"})
    assert outputs(llm, WORK["prompts"], params, WORK["arrivals"]) == plain
    assert_every_capture_succeeded(llm.stats())
    st = llm.stats()["speculative"]
    assert st["rounds"] > 0 and st["graphs"]["fallbacks"] == 0 and st["graphs"]["replays"] > 0


def test_one_sync_per_speculative_round():
    llm = engine("ouro-tiny", max_num_seqs=8, async_scheduling=False,
              speculative_config={"num_speculative_tokens": 3, "draft_loops": 2, "draft_policy": "fixed"})
    eng = llm.engine
    for i, p in enumerate(PROMPTS):
        eng.add_request(f"s{i}", p, SamplingParams(max_tokens=60, ignore_eos=True, temperature=0))
    for _ in range(6):
        eng.step()
    assert max_syncs_per_step(eng, 6) <= 1


@pytest.mark.parametrize("layout,chunk", [("shared", None), ("last_exited", 1), ("last_exited", 5)])
def test_graphs_match_eager_over_repeated_runs_with_many_prefill_only_steps(layout, chunk):
    """Position-by-position prefill (plane-sharing layouts, tiny chunks) makes runs of steps that
    read nothing back; graph replays let the host run ahead of them, and a staging bank refilled
    before its copy ran fed one step another's metadata (wrong, run-dependent tokens)."""
    prompts = [[5, 17, 3, 42, 8, 11, 60, 2, 9], [31, 7], list(range(40, 75))]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    options = dict(dtype="float32", kv_layout=layout, max_num_seqs=4, cuda_graph_sizes=[1, 2, 4],
                   **({"prefill_chunk_size": chunk} if chunk else {}))
    eager = engine("ouro-tiny", execution_mode="eager", async_scheduling=False, **options)
    graphs = engine("ouro-tiny", **options)

    def run(llm, batch):
        return [(o.outputs[0].token_ids, [lp.logprob for lp in o.outputs[0].logprobs])
                for o in llm.generate(batch, params, use_tqdm=False)]

    want = run(eager, prompts)
    for _ in range(2):
        assert run(graphs, prompts) == want
        assert [run(graphs, [p])[0] for p in prompts] == want


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_new_weights_reach_captured_graphs(tmp_path, quantization):
    """update_weights after CUDA graphs were captured (and the prefix cache filled), in two parts:
    the graphs read the new weights written in place (FP8 ones quantized on the host, the load's
    on the device), so the engine gives what an engine built with them gives."""
    from rlt_runtime.models.checkpoint import save_checkpoint
    from rlt_runtime.models.tokenizer import builtin_tokenizer

    cfg = preset_config("ouro-tiny")
    new = dict(preset_weights(cfg, seed=1, dtype=torch.float32))
    save_checkpoint(str(tmp_path), cfg, new, tokenizer=builtin_tokenizer(cfg))
    opts = dict(dtype="bfloat16", execution_mode="graphs", quantization=quantization)
    params = SamplingParams(max_tokens=8, temperature=0.0, seed=1, logprobs=2, ignore_eos=True)
    llm = engine("ouro-tiny", **opts)
    before = outputs(llm, PROMPTS, params)
    captured = llm.engine.executor.graph_stats()["graphs"]["captures"]
    assert captured > 0
    llm.update_weights(list(new.items())[::2])  # in two parts
    llm.update_weights(list(new.items())[1::2])
    want = outputs(engine(str(tmp_path), **opts), PROMPTS, params)
    assert want != before and outputs(llm, PROMPTS, params) == want
    assert llm.engine.executor.graph_stats()["graphs"]["replays"] > 0


@pytest.mark.parametrize("speculative", [False, True])
def test_sleep_gives_the_memory_back_and_the_graphs_are_captured_again(speculative):
    """sleep(level=1) hands the weights' and the KV cache's device memory back (and the graphs');
    after wake_up the engine captures its graphs again and gives the same outputs bit for bit."""
    spec = {"speculative_config": {"num_speculative_tokens": 2, "draft_loops": 1}} if speculative else {}
    llm = engine("ouro-tiny", dtype="bfloat16", execution_mode="graphs", kv_cache_dtype="fp8", enable_sleep_mode=True,
                 **spec)
    startup = llm.engine.executor.graph_stats()["graphs"]["captures"]
    params = SamplingParams(max_tokens=8, temperature=0.0, seed=1, logprobs=2, ignore_eos=True)
    before = outputs(llm, PROMPTS, params)
    captured = llm.engine.executor.graph_stats()["graphs"]["captures"]  # (and the variants captured on first use)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    given = llm.sleep(level=1)
    assert given > 0 and held - torch.cuda.memory_allocated() >= given
    llm.wake_up()
    assert startup > 0 and llm.engine.executor.graph_stats()["graphs"]["captures"] == captured + startup
    assert outputs(llm, PROMPTS, params) == before
