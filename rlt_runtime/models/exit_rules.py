"""Exit rules evaluated on the device after every loop (docs/design.md, "Exit policies").

All functions are plain torch on [B] tensors of the live rows, with no host synchronisation,
so they run inside a captured CUDA graph. `ExitState` carries the per-row running quantities
(survival for the hazard rule, the pending flag of the delayed/lookahead rules, the previous
recurrence's state or log-probs for Huginn's criteria).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import ConfigError

GATE_MODES = ("ouro", "ouro_delayed")
LOGIT_CRITERIA = ("kl", "entropy-diff", "argmax-stability")
STATE_CRITERIA = ("latent-diff", "cosine")


@dataclass(frozen=True)
class ExitRule:
    """The engine's exit rule as the models' `exit_decision` reads it.

    criterion_threshold: Huginn's engine-wide criterion threshold (Ouro's is per request);
    lookahead_w: random_lookahead's frozen head [1, hidden] (`lookahead_head`), else None.
    """

    mode: str
    criterion_threshold: Optional[float] = None
    lookahead_w: Optional[torch.Tensor] = None

    def may_exit_early(self, threshold: float, max_loops: int, depth: int) -> bool:
        """Whether a row with this exit_threshold and loop cap can leave before loop depth - 1. A
        row that cannot runs every loop whatever the rule computes, so a step of such rows alone
        may skip the rule (`ModelRunner.run_loops(fixed=True)`): the same bits, fewer kernels."""
        if max_loops < depth:
            return True
        if self.mode in GATE_MODES or self.mode == "random_lookahead":  # a request's exit_threshold decides
            return threshold < 1.0
        return self.mode != "fixed"


@dataclass
class ExitState:
    """Per-row running quantities of the exit rule, in the current row order."""

    survival: torch.Tensor  # fp32 [B]
    pending: torch.Tensor  # bool [B]: exit after the next loop (delayed / lookahead)
    prev: Optional[torch.Tensor] = None  # Huginn: previous state [B, H] or log-probs [B, V]
    prev_stat: Optional[torch.Tensor] = None  # Huginn: previous entropy / argmax [B]
    streak: Optional[torch.Tensor] = None  # Huginn argmax-stability count [B]

    def fields(self) -> tuple:
        return (self.survival, self.pending, self.prev, self.prev_stat, self.streak)

    def permute(self, order: torch.Tensor) -> "ExitState":
        return ExitState(*(None if t is None else t.index_select(0, order) for t in self.fields()))

    def park(self, row_id: torch.Tensor, into: "ExitState", scatter_rows) -> None:
        """Store rows into `into` at their row ids (-1: skip); scatter_rows is the kernel op."""
        for src, dst in zip(self.fields(), into.fields()):
            if src is not None:
                scatter_rows(src.to(dst.dtype), row_id, dst, active_rows=None)

    def empty_like(self, rows: int) -> "ExitState":
        """Parking buffers for `rows` rows (bool fields stored as uint8 for the row-scatter kernel)."""
        def buf(t):
            dtype = torch.uint8 if t.dtype == torch.bool else t.dtype
            return torch.zeros((rows,) + tuple(t.shape[1:]), dtype=dtype, device=t.device)

        return ExitState(*(None if t is None else buf(t) for t in self.fields()))

    def gather(self, index: torch.Tensor) -> "ExitState":
        """Rows of parking buffers as a live ExitState (uint8 flags back to bool)."""
        picked = [None if t is None else t.index_select(0, index) for t in self.fields()]
        picked[1] = picked[1].bool()
        return ExitState(*picked)


def new_exit_state(rows: int, device) -> ExitState:
    return ExitState(torch.ones(rows, dtype=torch.float32, device=device), torch.zeros(rows, dtype=torch.bool, device=device))


def ouro_exit(mode: str, t: int, gate: Optional[torch.Tensor], lookahead: Optional[torch.Tensor], threshold, min_loops,
              max_loops, trace_depth, state: ExitState) -> torch.Tensor:
    """Exit decision after loop t (0-based) for Ouro's modes; updates `state` in place.

    gate / lookahead: fp32 logits [B] (None when the mode does not read them); threshold fp32,
    min_loops, max_loops, trace_depth int32 [B]. Returns bool [B].
    """
    r = t + 1
    cap = max_loops <= r
    if mode == "trace":
        return cap | (trace_depth <= r)
    enabled = threshold < 1.0
    if mode in GATE_MODES:
        state.survival.mul_(1.0 - torch.sigmoid(gate))
        trigger = enabled & (min_loops <= r) & ((1.0 - state.survival) >= threshold)
        if mode == "ouro":
            return cap | trigger
        decided = cap | state.pending
        state.pending.copy_(trigger)
        return decided
    if mode == "random_lookahead":
        decided = cap | state.pending
        state.pending.copy_(enabled & (torch.sigmoid(lookahead) >= threshold) & (min_loops <= r + 1))
        return decided
    raise ConfigError(f"unknown exit mode {mode!r}")


def huginn_exit(mode: str, t: int, threshold: float, min_loops, max_loops, trace_depth, state: ExitState,
                s: torch.Tensor, logprobs: Optional[torch.Tensor]) -> torch.Tensor:
    """Exit decision after recurrence t (0-based) for Huginn's modes; updates `state` in place.

    s: the new state [B, H]; logprobs: log_softmax of the recurrence's logits, fp32 [B, V]
    (criteria that read the output distribution only). Returns bool [B].
    """
    r = t + 1
    cap = max_loops <= r
    if mode == "fixed":
        return cap
    if mode == "trace":
        return cap | (trace_depth <= r)
    ok = min_loops <= r
    if mode in STATE_CRITERIA:
        sf, prev = s.float(), state.prev.float()
        if mode == "latent-diff":
            stat = (sf - prev).norm(dim=1) / sf.norm(dim=1).clamp(min=1e-30)
        else:
            stat = 1.0 - torch.nn.functional.cosine_similarity(sf, prev, dim=1, eps=1e-30)
        state.prev.copy_(s)
        return cap | (ok & (stat < threshold))
    if mode == "kl":
        p_prev = state.prev.exp()
        kl = (p_prev * (state.prev - logprobs)).sum(dim=1)
        state.prev.copy_(logprobs)
        return cap | (ok & (kl < threshold))
    if mode == "entropy-diff":
        ent = -(logprobs.exp() * logprobs).sum(dim=1)
        diff = (ent - state.prev_stat).abs()
        state.prev_stat.copy_(ent)
        return cap | (ok & (diff < threshold))
    if mode == "argmax-stability":
        top = logprobs.argmax(dim=1)
        same = top == state.prev_stat.long()
        state.streak.copy_(torch.where(same, state.streak + 1, torch.ones_like(state.streak)))
        state.prev_stat.copy_(top.to(state.prev_stat.dtype))
        return cap | (ok & (state.streak >= threshold))
    raise ConfigError(f"unknown exit mode {mode!r}")


def init_huginn_state(mode: str, rows: int, s0: torch.Tensor, vocab: int, device) -> ExitState:
    """Starting state for Huginn's criteria (uniform previous distribution, H_0 = log V)."""
    st = new_exit_state(rows, device)
    if mode in STATE_CRITERIA:
        st.prev = s0.clone()
    elif mode == "kl":
        st.prev = torch.full((rows, vocab), -math.log(vocab), dtype=torch.float32, device=device)
    elif mode == "entropy-diff":
        st.prev_stat = torch.full((rows,), math.log(vocab), dtype=torch.float32, device=device)
    elif mode == "argmax-stability":
        st.prev_stat = torch.full((rows,), -1, dtype=torch.int64, device=device)
        st.streak = torch.zeros(rows, dtype=torch.int64, device=device)
    return st


def lookahead_logits(h: torch.Tensor, w: torch.Tensor, ops, active) -> torch.Tensor:
    """random_lookahead's head logit per row, fp32 [B]: h [B, hidden] times w [1, hidden]."""
    out = torch.empty((h.shape[0], 1), dtype=torch.float32, device=h.device)
    ops.linear(h, w, out=out, active_rows=active)
    return out[:, 0]


def lookahead_head(hidden: int, seed: int, device, dtype) -> torch.Tensor:
    """The frozen random exit head of `random_lookahead`: weight [1, hidden] ~ N(0, 1/hidden), bias 0."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn((1, hidden), generator=g, dtype=torch.float32) / math.sqrt(hidden)
    return w.to(device=device, dtype=dtype)
