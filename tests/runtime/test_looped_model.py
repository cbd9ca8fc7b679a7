"""The looped-model interface the runner drives every family through (models/looped.py)."""

import pytest
import torch

from rlt_runtime.cache.layout import make_layout
from rlt_runtime.errors import ConfigError
from rlt_runtime.executor.model_runner import ModelRunner
from rlt_runtime.models import build_model
from rlt_runtime.models.looped import LOOPED_MODEL_MEMBERS, check_looped_model
from rlt_runtime.models.presets import preset_config

PRESETS = ("ouro-tiny", "huginn-tiny")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_family_implements_the_interface(preset):
    """Catches a model class missing a member the runner calls (it would fail inside a step)."""
    cfg = preset_config(preset)
    model = build_model(cfg, make_layout(cfg, "last_exited", 4), "cpu", torch.float32)
    check_looped_model(model)
    assert {"start", "loop", "head_input", "logits", "new_exit_state", "exit_decision"} <= set(LOOPED_MODEL_MEMBERS)


def test_a_model_lacking_members_fails_at_runner_construction():
    """Catches the runner accepting a model it cannot drive: the error names what is missing."""

    class Incomplete:
        rope_style, kv_heads = "neox", 2

        def loop(self, h, e, batch, t):
            return h

    with pytest.raises(ConfigError, match=r"Incomplete lacks .*'start'.*'exit_decision'"):
        ModelRunner(Incomplete(), None, None, ops=None, device="cpu", dtype=torch.float32, num_slots=1, num_blocks=1,
                    block_size=16, max_model_len=16, max_rows=1, max_tokens=16, exit_mode="fixed",
                    criterion_threshold=None, lookahead_seed=0)


@pytest.mark.parametrize("preset,kv_layout", [(p, k) for p in PRESETS for k in ("last_exited", "shared")]
                         + [("huginn-tiny", "compress-s4")])
def test_key_depths_go_through_plane_0(preset, kv_layout):
    """Catches key depths indexed through another plane's blocks (swaps save plane 0's, and
    attention reads the table by the key's plane-0 block)."""
    cfg = preset_config(preset)
    spec = make_layout(cfg, kv_layout, 4).key_depth_plane()
    assert (spec.write_plane, spec.query_depth) == (0, 0)
