"""rlt-serve with --disaggregated-prefill: a prefill and a decode process behind one server answer
like one engine, streamed and not, and leave both KV pools empty."""

from __future__ import annotations

import re

import httpx
import pytest

from rlt_runtime import LLM, SamplingParams

openai = pytest.importorskip("openai")

MODEL = "ouro-tiny"
PROMPTS = ["The quick brown fox", "Hello there", "A looped model runs"]


def _metric(url: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(url + "/metrics").text, re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


@pytest.mark.slow
def test_rlt_serve_with_a_prefill_and_a_decode_process(start_process, tmp_path):
    proc, url = start_process(tmp_path / "serve.log", "--disaggregated-prefill", "--max-num-seqs", "4")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
        reference = LLM(MODEL, dtype="float32", device="cpu", num_blocks=256, max_num_seqs=4)
        expected = reference.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                                      use_tqdm=False)
        greedy = client.completions.create(model=MODEL, prompt=PROMPTS, max_tokens=8, temperature=0,
                                           extra_body={"ignore_eos": True})
        assert [c.text for c in sorted(greedy.choices, key=lambda c: c.index)] == [o.outputs[0].text for o in expected]
        stream = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=8, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        assert "".join(chunk.choices[0].text for chunk in stream) == expected[1].outputs[0].text
        assert _metric(url, "vllm:num_requests_running") == 0
        assert _metric(url, "vllm:kv_cache_usage_perc") == 0.0
    finally:
        proc.terminate()
