"""Default sampling parameters from a checkpoint's generation_config.json (engine option
generation_config, vLLM's --generation-config): "auto" reads the model's file, "vllm" none, a
directory its own; they apply where a request leaves a field out (LLM.generate without
SamplingParams, server requests), never over a given value; max_new_tokens becomes the default
max_tokens; bad files are refused by name; the Hub resolves the file with the checkpoint."""

from __future__ import annotations

import json

import httpx
import pytest
import torch

from rlt_runtime import LLM, ConfigError, SamplingParams
from rlt_runtime.engine.llm_engine import LLMEngine
from rlt_runtime.models import hub
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.presets import preset_config, preset_weights
from rlt_runtime.models.tokenizer import builtin_tokenizer

OPTIONS = dict(dtype="float32", device="cpu", max_num_seqs=2, max_model_len=128)
PROMPTS = [list(range(5, 25)), list(range(40, 52))]
DEFAULTS = {"temperature": 0.0, "top_k": 0, "max_new_tokens": 3, "do_sample": True, "eos_token_id": 7}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ouro-with-defaults")
    cfg = preset_config("ouro-tiny")
    save_checkpoint(str(path), cfg, dict(preset_weights(cfg, seed=0, dtype=torch.float32)),
                    tokenizer=builtin_tokenizer(cfg))
    (path / "generation_config.json").write_text(json.dumps(DEFAULTS))
    return str(path)


def _tokens(outs) -> list:
    return [o.outputs[0].token_ids for o in outs]


def test_generate_without_params_takes_the_models_defaults(checkpoint):
    llm = LLM(checkpoint, **OPTIONS)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, top_k=-1, max_tokens=3)  # (0: off)
    greedy = _tokens(llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False))
    assert _tokens(llm.generate(PROMPTS, use_tqdm=False)) == greedy and all(len(t) == 3 for t in greedy)
    given = SamplingParams(temperature=1.0, seed=5, max_tokens=6)  # given params are used as they are
    out = _tokens(llm.generate(PROMPTS, given, use_tqdm=False))
    assert all(len(t) == 6 for t in out) and [t[:3] for t in out] != greedy
    plain = LLM(checkpoint, generation_config="vllm", **OPTIONS)
    assert plain.get_default_sampling_params() == SamplingParams()


def test_a_directory_of_its_own_and_bad_sources(checkpoint, tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 0.5, "temperature": "hot"}))
    llm = LLM("ouro-tiny", generation_config=str(tmp_path), **OPTIONS)  # (a preset has no file of its own)
    assert llm.get_default_sampling_params() == SamplingParams(top_p=0.5)  # ("hot" is not a number: left out)
    with pytest.raises(ConfigError, match="generation_config must be 'auto'.*got '/nonexistent'"):
        LLM("ouro-tiny", generation_config="/nonexistent", **OPTIONS)
    (tmp_path / "generation_config.json").write_text(json.dumps({"top_p": 1.5}))
    with pytest.raises(ConfigError, match="generation_config.json: top_p must be"):
        LLM("ouro-tiny", generation_config=str(tmp_path), **OPTIONS)
    assert "generation_config.json" in hub.ALLOW_PATTERNS and "generation_config.json" not in hub.TOKENIZER_PATTERNS


def test_server_requests_take_the_defaults_for_what_they_leave_out(checkpoint, start_server):
    with start_server(engine_factory=lambda: LLMEngine(checkpoint, **OPTIONS), served_model_name="m") as live:
        assert live.worker.wait_ready(120)
        def complete(**kw):
            body = dict(prompt=PROMPTS[0], return_token_ids=True, **kw)
            return httpx.post(live.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["token_ids"]

        greedy = complete(temperature=0, max_tokens=3)
        assert complete(max_tokens=3) == greedy  # temperature 0 from the file
        assert complete(max_tokens=None) == greedy  # and 3 tokens (completions' own default is OpenAI's 16)
        assert len(complete()) == 16 and len(complete(max_tokens=5)) == 5
        assert complete(temperature=1.0, seed=3, max_tokens=3) != greedy
        chat = httpx.post(live.url + "/v1/chat/completions", json=dict(messages=[{"role": "user", "content": "Hi"}]),
                          timeout=60).json()
        assert chat["usage"]["completion_tokens"] <= 3
