"""lm-eval's `local-completions` model end to end against a live rlt-serve: a multiple-choice
(log-likelihood) task and a generate_until task from fixtures/lm_eval, on a tiny ouro checkpoint
written to disk with its tokenizer (which lm-eval loads with AutoTokenizer). Each choice's
log-likelihood lm-eval computes from the echoed prompt log-probabilities equals the fp64 dense
reference's; each generation is the reference's greedy text up to the stop string."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

lm_eval = pytest.importorskip("lm_eval")
yaml = pytest.importorskip("yaml")
for _api_dependency in ("aiohttp", "tenacity", "requests"):  # lm-eval[api], what local-completions needs
    pytest.importorskip(_api_dependency)

from rlt_runtime.engine.llm_engine import LLMEngine  # noqa: E402
from rlt_runtime.models.checkpoint import save_checkpoint  # noqa: E402
from rlt_runtime.models.dense_reference import reference_generate  # noqa: E402
from rlt_runtime.models.presets import preset_config, preset_weights  # noqa: E402
from rlt_runtime.models.tokenizer import builtin_tokenizer  # noqa: E402

from conftest import ENGINE_DEFAULTS  # noqa: E402

TASKS = Path(__file__).parent / "fixtures" / "lm_eval"
TOL = 1e-3  # a sum of ~10 fp32 log-probabilities against fp64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """(directory, fp64 weights) of ouro-tiny saved with its built-in tokenizer."""
    cfg = preset_config("ouro-tiny")
    path = tmp_path_factory.mktemp("ouro-ckpt")
    save_checkpoint(str(path), cfg, preset_weights(cfg, seed=0), tokenizer=builtin_tokenizer(cfg))
    return path, dict(preset_weights(cfg, seed=0, dtype=torch.float64))


def task_dir(tmp_path: Path) -> Path:
    """The fixture tasks with their data files at absolute paths (datasets resolves relative ones
    against the working directory)."""
    for spec in TASKS.glob("*.yaml"):
        config = yaml.safe_load(spec.read_text())
        files = config["dataset_kwargs"]["data_files"]
        config["dataset_kwargs"]["data_files"] = {k: str(TASKS / v) for k, v in files.items()}
        (tmp_path / spec.name).write_text(yaml.safe_dump(config))
    return tmp_path


@pytest.mark.slow
def test_lm_eval_local_completions(start_server, checkpoint, tmp_path, monkeypatch):
    from lm_eval.tasks import TaskManager

    path, weights = checkpoint
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with start_server(engine_factory=lambda: LLMEngine(str(path), **ENGINE_DEFAULTS), served_model_name="tiny") as live:
        live.worker.wait_ready(120)
        results = lm_eval.simple_evaluate(
            model="local-completions",
            model_args={"model": "tiny", "base_url": live.url + "/v1/completions", "tokenizer": str(path),
                        "tokenizer_backend": "huggingface", "max_retries": 1, "num_concurrent": 1, "max_length": 120},
            tasks=["rlt_tiny_choice", "rlt_tiny_generate"], task_manager=TaskManager(include_path=str(task_dir(tmp_path))),
            log_samples=True, bootstrap_iters=0,
        )
    cfg = preset_config("ouro-tiny")
    tok = builtin_tokenizer(cfg)

    choice = results["samples"]["rlt_tiny_choice"]
    assert len(choice) == 3 and "acc,none" in results["results"]["rlt_tiny_choice"]
    for sample in choice:
        doc = sample["doc"]
        context = tok.encode(doc["question"], add_special_tokens=False)
        for option, resp in zip(doc["choices"], sample["resps"]):
            ids = tok.encode(doc["question"] + " " + option, add_special_tokens=False)
            logits = reference_generate(cfg, weights, ids, 1).prompt_logits
            want = sum(float(torch.log_softmax(logits[p - 1], -1)[ids[p]]) for p in range(len(context), len(ids)))
            assert abs(resp[0][0] - want) < TOL, (doc["question"], option, resp[0][0], want)

    generate = results["samples"]["rlt_tiny_generate"]
    assert len(generate) == 2
    for sample in generate:
        ids = tok.encode(sample["doc"]["question"], add_special_tokens=False)
        ref = reference_generate(cfg, weights, ids, 4, stop_token_ids=tok.eos_token_ids).tokens
        want = tok.decode([t for t in ref if t not in tok.eos_token_ids]).split("\n")[0]
        assert sample["resps"][0][0] == want
