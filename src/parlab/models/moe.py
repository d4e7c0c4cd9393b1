"""A small mixture-of-experts layer: a top-k router and E feed-forward experts.

The layer knows nothing about parallelism; lab 07 spreads its experts over
ranks (expert parallelism) and checks the result against this module run in
one process.

Routing (Shazeer et al. 2017, arXiv 1701.06538; GShard, Lepikhin et al.
2020, arXiv 2006.16668):

- the router is a linear layer; its softmax over the E experts gives each
  token's probabilities, and the token goes to its ``top_k`` most probable
  experts, weighted by those probabilities (not renormalised);
- with a ``capacity_factor`` cf, an expert takes at most
  C = ceil(cf · tokens · top_k / E) assignments of one batch.  The dropped-
  token rule: assignments are served in token order (token 0 first; a
  token's choices in the order top-1, top-2, ...), and those beyond an
  expert's C are dropped: that slot adds nothing to the token's output
  (in a transformer the residual connection carries the token on).  The
  capacity counts the tokens of the batch the layer is called on (GShard's
  "group"); under expert parallelism that is each rank's own batch.
- with ``capacity_factor=None`` nothing is dropped.

``route(router, x, top_k, capacity_factor)`` is the routing alone, so a
layer built from this one's parts routes exactly as it does.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Expert", "MoE", "capacity", "route", "tiny_moe"]


class Expert(nn.Module):
    """One expert: Linear(d, f), GELU, Linear(f, d)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


def capacity(tokens: int, top_k: int, n_experts: int, capacity_factor: float | None) -> int | None:
    """Assignments one expert takes from a batch of ``tokens`` (None: no limit)."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * tokens * top_k / n_experts)


def route(router: nn.Linear, x: torch.Tensor, top_k: int, capacity_factor: float | None = None):
    """(expert, weight, kept) for tokens ``x`` of shape (T, d), each (T, top_k).

    ``expert[t, j]`` is token t's j-th choice, ``weight[t, j]`` its router
    probability (differentiable), ``kept[t, j]`` False where the capacity
    rule dropped that assignment.
    """
    if x.dim() != 2:
        raise ValueError(f"route expects tokens of shape (T, d_model), got {tuple(x.shape)}: flatten "
                         "the batch and sequence dimensions first")
    probs = F.softmax(router(x), dim=-1)
    weight, expert = probs.topk(top_k, dim=-1)
    cap = capacity(x.shape[0], top_k, probs.shape[-1], capacity_factor)
    if cap is None:
        return expert, weight, torch.ones_like(expert, dtype=torch.bool)
    flat = expert.reshape(-1)  # (T·top_k,), token-major: token 0's choices first
    seen = F.one_hot(flat, probs.shape[-1]).cumsum(0).gather(1, flat[:, None]).squeeze(1)  # (T·top_k,): its expert's count so far, itself included
    return expert, weight, (seen <= cap).reshape(expert.shape)  # kept: (T, top_k) again


class MoE(nn.Module):
    """``MoE(d_model, d_ff, n_experts, top_k=2, capacity_factor=None)`` on tokens (T, d_model)."""

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int = 2,
                 capacity_factor: float | None = None):
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts ({n_experts}), got {top_k}")
        self.n_experts, self.top_k, self.capacity_factor = n_experts, top_k, capacity_factor
        self.router = nn.Linear(d_model, n_experts)
        self.experts = nn.ModuleList(Expert(d_model, d_ff) for _ in range(n_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        expert, weight, kept = route(self.router, x, self.top_k, self.capacity_factor)
        out = torch.zeros_like(x)
        for e, module in enumerate(self.experts):
            token, slot = torch.nonzero((expert == e) & kept, as_tuple=True)
            if token.numel():
                out = out.index_add(0, token, weight[token, slot, None] * module(x[token]))
        return out


def tiny_moe(d_model: int = 8, d_ff: int = 16, n_experts: int = 4, top_k: int = 2,
             capacity_factor: float | None = None, seed: int = 0, silent: tuple = (),
             dtype=torch.float64) -> MoE:
    """A seeded MoE; the experts in ``silent`` get a router bias so low that no token picks them."""
    with torch.random.fork_rng():  # leaves the caller's random state alone
        torch.manual_seed(seed)
        moe = MoE(d_model, d_ff, n_experts, top_k, capacity_factor).to(dtype)
    with torch.no_grad():
        for e in silent:
            moe.router.bias[e] = -1e4
    return moe
