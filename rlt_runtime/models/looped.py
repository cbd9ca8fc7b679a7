"""The interface the model runner drives a looped model through (docs/design.md, "Runner and models").

Every family (`OuroModel`, `HuginnModel`) implements these members, and the runner never asks
which family it runs: a new looped family is a new model class. Rows: M tokens; h: the state a
loop reads and returns [M, hidden]; e: the per-row input every loop also reads [M, hidden], or
None where the loops read only h; batch: the pass's `ForwardBatch`; ops: the kernel namespace.
"""

from __future__ import annotations

from typing import Optional, Protocol

import torch

from ..errors import ConfigError
from .exit_rules import ExitRule, ExitState


class LoopedModel(Protocol):
    rope_style: str  # rotary layout of the attention layers, "neox" or "gptj"
    kv_heads: int  # this rank's K/V heads
    random_initial_state: bool  # start() reads the rows' noise keys (otherwise keys may be None)
    head_input_attends: bool  # head_input() runs attention layers (it needs the rows' real batch)

    def start(self, tokens: torch.Tensor, batch, keys: Optional[torch.Tensor]
              ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(h, e) before loop 0 for tokens [M] int64 at batch.positions; keys: int64 [M] noise keys."""

    def loop(self, h: torch.Tensor, e: Optional[torch.Tensor], batch, t: int) -> torch.Tensor:
        """Loop t (0-based) over every row: the new h."""

    def head_input(self, h: torch.Tensor, batch) -> torch.Tensor:
        """The LM head's input [M, hidden] from rows' final h."""

    def logits(self, n: torch.Tensor, ops, active=None, out=None) -> torch.Tensor:
        """LM head: fp32 [M, vocab]."""

    def new_exit_state(self, mode: str, h0: torch.Tensor) -> ExitState:
        """The exit rule's running state for rows starting from h0."""

    def exit_decision(self, rule: ExitRule, t: int, h: torch.Tensor, batch, rows
                      ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Which rows exit after loop t (bool [M]; updates rows.ex in place), and the head logits
        fp32 [M, vocab] when the rule computed them on the way (else None). rows: the runner's
        `RowState` (thr, min_l, max_l, trace, ex)."""


LOOPED_MODEL_MEMBERS = tuple(LoopedModel.__annotations__) + tuple(
    name for name, value in vars(LoopedModel).items() if callable(value) and not name.startswith("_"))


def check_looped_model(model) -> None:
    """Raise ConfigError naming the `LoopedModel` members `model` lacks."""
    missing = [name for name in LOOPED_MODEL_MEMBERS if not hasattr(model, name)]
    if missing:
        raise ConfigError(f"model class {type(model).__name__} lacks the looped-model members {missing} "
                          f"(rlt_runtime/models/looped.py)")
