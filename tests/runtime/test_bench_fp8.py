"""perf/bench_fp8's FP8 floors: the layers' weights at one byte a parameter, the rest in bf16."""

import json
import math

import pytest

from perf.bench_engine import floor_ms, weight_bytes_per_step
from perf.bench_fp8 import fp8_weight_bytes_per_step
from rlt_runtime.models.configs import hf_weight_shapes
from rlt_runtime.models.presets import preset_config


def test_fp8_weight_bytes_halve_the_layers_only():
    cfg = preset_config("ouro-1.4b")
    shapes = hf_weight_shapes(cfg)
    layers = sum(math.prod(s) for n, s in shapes.items() if ".layers." in n and len(s) == 2)
    head = math.prod(shapes["lm_head.weight"])
    bf16 = weight_bytes_per_step(cfg, 4)
    fp8 = fp8_weight_bytes_per_step(cfg, 4)
    assert bf16 - fp8 == 4 * layers  # four loops re-read the layers, one byte saved a parameter each
    assert fp8 > 4 * layers + 2 * head - 4 * 10**6  # the head (and the norms) stay bf16
    roof = {"copy_gbps": 4000.0, "gemm_tflops": 700.0}
    assert floor_ms(cfg, 4, 1, roof, weight_bytes=fp8) < 0.6 * floor_ms(cfg, 4, 1, roof)
    assert floor_ms(cfg, 4, 256, roof, weight_bytes=fp8, kv_elem_bytes=1) < floor_ms(cfg, 4, 256, roof)


def test_teacher_forced_rows_are_the_next_token_distributions():
    """Row j of the observed LM-head output predicts token j + 1: its log-probability there is the
    engine's own prompt log-probability of that token (an off-by-one would pair the wrong rows)."""
    from perf.bench_fp8 import _teacher_forced_logprobs
    from rlt_runtime import LLM, SamplingParams

    llm = LLM("ouro-tiny", dtype="float32", execution_mode="eager", max_num_seqs=2)
    seq = [17, 40, 41, 99, 5, 230, 230, 61]
    rows = _teacher_forced_logprobs(llm, seq)
    assert rows.shape == (len(seq) - 1, llm.engine.model_config.vocab_size)
    want = llm.generate([seq], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0].prompt_logprobs
    got = [float(rows[j, seq[j + 1]]) for j in range(len(seq) - 1)]
    assert got == pytest.approx([lp.logprob for lp in want[1:]], abs=1e-5)


def test_fidelity_smoke_on_cpu(tmp_path):
    """The fidelity part alone on ouro-tiny: the bf16 control is exactly the reference (0 KL, full
    agreement), the FP8 engines differ a little, and both files are written."""
    from perf.bench_fp8 import CONTROL, main

    main(["--out", str(tmp_path), "--model", "ouro-tiny", "--parts", "fidelity", "--prompts", "2",
          "--fidelity-prompt-len", "6", "--fidelity-output-len", "5"])
    res = json.loads((tmp_path / "fp8.json").read_text())
    quantized = ["fp8 weights", "fp8 weights + KV", "w8a8", "w8a8 + KV"]
    assert res["speed"] == {} and list(res["fidelity"]) == [CONTROL, *quantized]
    control = res["fidelity"][CONTROL]
    assert control["mean_kl"] == 0.0 and control["max_kl"] == 0.0
    assert control["greedy_agreement"] == control["teacher_forced_argmax_agreement"] == 1.0
    assert control["exit_depth_agreement"] == 1.0 and control["exit_depth_positions"] == 2 * 5
    for name in quantized:
        f = res["fidelity"][name]
        assert f["positions"] == 2 * 5 and 0.0 < f["mean_kl"] <= f["max_kl"]
        for key in ("greedy_agreement", "teacher_forced_argmax_agreement", "exit_depth_agreement"):
            assert 0.0 <= f[key] <= 1.0
    assert "| fp8 weights + KV |" in (tmp_path / "fp8.md").read_text()


def test_median_run_is_the_middle_run_with_the_spread():
    from perf.bench_fp8 import median_run

    runs = [{"ms_per_step": ms, "tok_per_s": 1000 / ms, "seed": i} for i, ms in enumerate((18.6, 20.2, 18.5))]
    mid = median_run(runs)
    assert mid["seed"] == 0 and mid["ms_per_step"] == 18.6 and mid["tok_per_s"] == 1000 / 18.6
    assert (mid["ms_per_step_min"], mid["ms_per_step_max"]) == (18.5, 20.2)
    assert mid["runs_ms_per_step"] == [18.6, 20.2, 18.5]  # in run order
    assert median_run(runs[:2])["ms_per_step"] == 20.2  # an even count takes the slower middle run
    assert runs[0] == {"ms_per_step": 18.6, "tok_per_s": 1000 / 18.6, "seed": 0}  # inputs untouched


def test_speed_smoke_on_cpu_repeats_each_batch(tmp_path, monkeypatch):
    """The speed part on ouro-tiny: every batch runs --repeats times with its own prompts (seed =
    run) and reports the median run and the spread; the markdown shows the range. Engines are
    timed with the heap frozen, as the CLI and server run them, and thawed once dropped."""
    import gc

    import perf.bench_fp8 as bench
    from rlt_runtime.entrypoints import bench_offline

    seeds, frozen = [], []
    real = bench_offline.decode_benchmark

    def recorded(llm, batch, input_len, output_len, **kw):
        seeds.append((batch, kw.get("seed")))
        frozen.append(gc.get_freeze_count())
        return real(llm, batch, input_len, output_len, **kw)

    monkeypatch.setattr(bench, "decode_benchmark", recorded)
    gc.unfreeze()  # whatever another test froze: the freezes counted below are the benchmark's
    bench.main(["--out", str(tmp_path), "--model", "ouro-tiny", "--parts", "speed", "--configs", "bf16", "w8a8",
                "--batches", "1", "2", "--input-len", "4", "--output-len", "3", "--repeats", "3"])
    res = json.loads((tmp_path / "fp8.json").read_text())
    assert res["repeats"] == 3 and list(res["speed"]) == ["bf16", "w8a8"]
    for runs in res["speed"].values():
        for b in ("1", "2"):
            r = runs[b]
            assert len(r["runs_ms_per_step"]) == 3
            assert r["ms_per_step"] == sorted(r["runs_ms_per_step"])[1]
            assert r["ms_per_step_min"] == min(r["runs_ms_per_step"]) and r["ms_per_step_max"] == max(r["runs_ms_per_step"])
    timed = [s for s in seeds if s[1] is not None]
    assert timed == [(b, i) for _ in range(2) for b in (1, 2) for i in range(3)]
    assert "ms/step range" in (tmp_path / "fp8.md").read_text()
    assert min(frozen) > 0 and gc.get_freeze_count() == 0
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--model", "ouro-tiny", "--parts", "speed", "--repeats", "0"])


def test_speed_engines_take_the_graph_sizes(tmp_path, monkeypatch):
    """--graph-sizes reaches every speed engine as cuda_graph_sizes and is recorded; without it the
    engines keep their own ladder (cuda_graph_sizes None)."""
    import perf.bench_engine as bench_engine
    import perf.bench_fp8 as bench

    seen = []
    real = bench_engine.engine

    def recorded(model, **kw):
        seen.append(kw.get("cuda_graph_sizes"))
        return real(model, **kw)

    monkeypatch.setattr(bench_engine, "engine", recorded)
    args = ["--out", str(tmp_path), "--model", "ouro-tiny", "--parts", "speed", "--configs", "bf16", "w8a8 + KV",
            "--batches", "2", "--input-len", "4", "--output-len", "2", "--repeats", "1"]
    bench.main(args + ["--graph-sizes", "2"])
    assert seen == [[2], [2]]
    assert json.loads((tmp_path / "fp8.json").read_text())["graph_sizes"] == [2]
    bench.main(args)
    assert seen[2:] == [None, None]
    assert json.loads((tmp_path / "fp8.json").read_text())["graph_sizes"] is None
