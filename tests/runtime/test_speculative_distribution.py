"""Sampled speculation on a model with peaked logits: drafts are accepted at a healthy rate and
every committed token follows the target distribution softmax(logits / T) of the fp64 dense
reference, at a temperature T != 1 (the proposal q must be the draft head's distribution at the
request's temperature, the one the drafts were drawn from)."""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

from rlt_runtime import LLM, SamplingParams
from rlt_runtime.models.checkpoint import save_checkpoint
from rlt_runtime.models.dense_reference import reference_generate
from rlt_runtime.models.presets import preset_config, preset_weights

PROMPT = [11, 12, 13]
TEMPERATURE = 3.0
MAX_TOKENS = 5  # the first token comes from the prefill; rounds of up to 3 drafts commit the rest
REQUESTS = 200
MIN_GROUP = 10  # prefixes seen fewer times are left out of the test (too few draws to say anything)


def peaked_weights() -> dict[str, torch.Tensor]:
    """ouro-tiny with small loop updates and peaked logits (fp64).

    The sub-layer output norms are scaled by 0.05 and the embeddings by 50, so a token's state
    stays near its embedding and the draft after one loop mostly agrees with the target after
    four; the LM head scaled by 100 makes the logits peaked (the random preset's are nearly flat,
    where drafts are rarely accepted and the temperature barely matters).
    """
    cfg = preset_config("ouro-tiny")
    w = dict(preset_weights(cfg, seed=0, dtype=torch.float64))
    w["lm_head.weight"] = w["lm_head.weight"] * 100
    w["model.embed_tokens.weight"] = w["model.embed_tokens.weight"] * 50
    for name in w:
        if name.endswith(("input_layernorm_2.weight", "post_attention_layernorm_2.weight")):
            w[name] = w[name] * 0.05
    return w


@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """(checkpoint directory, fp64 weights) of the peaked model."""
    w = peaked_weights()
    path = str(tmp_path_factory.mktemp("peaked-ouro"))
    save_checkpoint(path, preset_config("ouro-tiny"), w, dtype=torch.float32)
    return path, w


def chi_square_pvalue(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution with dof degrees of freedom."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def pearson(counts: Counter, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic and dof of token counts against probs [vocab]: tokens expected at
    least 5 times get a cell each, the rest share one (merged into the last cell when that
    shared cell would be expected fewer than 5 times)."""
    m = sum(counts.values())
    expected = probs * m
    big = (expected >= 5).nonzero().flatten().tolist()
    cells = [(counts[t], float(expected[t])) for t in big]
    rest = (m - sum(o for o, _ in cells), m - sum(e for _, e in cells))
    if rest[1] >= 5 or not cells:
        cells.append(rest)
    else:
        o, e = cells[-1]
        cells[-1] = (o + rest[0], e + rest[1])
    return sum((o - e) ** 2 / e for o, e in cells), len(cells) - 1


def test_sampled_speculation_on_peaked_logits(peaked):
    path, w = peaked
    cfg = preset_config("ouro-tiny")
    llm = LLM(path, dtype="float32", max_num_seqs=16,
              speculative_config={"num_speculative_tokens": 3, "draft_loops": 1, "draft_policy": "fixed"})
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=s, ignore_eos=True)
              for s in range(REQUESTS)]
    outs = [o.outputs[0].token_ids for o in llm.generate([PROMPT] * REQUESTS, params, use_tqdm=False)]
    st = llm.stats()["speculative"]
    assert st["accepted"] >= 0.4 * st["drafted"], st  # about 0.57 with these weights

    # Every token after the prefill's (committed by a round, or by a plain step near max_tokens)
    # must be one draw from p(. | prompt + prefix): group the draws by prefix and test each group
    # against the reference.
    draws: dict[tuple, Counter] = defaultdict(Counter)
    for tokens in outs:
        assert len(tokens) == MAX_TOKENS
        for i in range(1, MAX_TOKENS):
            draws[tuple(tokens[:i])][tokens[i]] += 1
    stat, dof = 0.0, 0
    for prefix, counts in draws.items():
        if sum(counts.values()) < MIN_GROUP:
            continue
        logits = reference_generate(cfg, w, PROMPT + list(prefix), 1).logits[0]
        s, d = pearson(counts, torch.softmax(logits / TEMPERATURE, -1))
        stat, dof = stat + s, dof + d
    assert dof >= 8, dof  # about 15 with these weights: enough cells to see a skewed distribution
    assert chi_square_pvalue(stat, dof) > 1e-3, (stat, dof)
