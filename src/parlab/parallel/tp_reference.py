"""Single-process pieces that Lab 03 (tensor parallelism) and its checks share.

Nothing here is parallel: these are the full layers that a tensor-parallel
layer must reproduce.  The students' f/g functions, parallel layers and
blocks live in their notebook.

- ``reference_linear(in, out, bias, seed)``: the full ``nn.Linear`` every rank
  builds from the same seed before keeping its shard (Megatron-LM's CPU
  initialisation does the same: Shoeybi et al. 2019, arXiv 1909.08053).  Its
  bias is random, not zero, so a bias added on every rank shows.
- ``randomize_(module, seed)``: every parameter drawn afresh (biases and
  LayerNorm weights included), for the same reason.

Activation memory (what Korthikanti et al. 2022, arXiv 2205.05198, count) is
measured with ``parlab.parallel.pp_stages.held_activations``.
"""
from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["reference_linear", "randomize_"]


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def reference_linear(in_features: int, out_features: int, bias: bool = True, seed: int = 0,
                     device=None) -> nn.Linear:
    """A full ``nn.Linear`` with weights drawn from ``seed`` alone (global RNG untouched).

    Weight ~ N(0, 1/in_features), bias ~ N(0, 0.1²): the same numbers on every
    rank and in the grader that asks with the same arguments.
    """
    for name, value in (("in_features", in_features), ("out_features", out_features)):
        if int(value) < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    with torch.random.fork_rng(devices=[]):
        layer = nn.Linear(in_features, out_features, bias=bias)
    randomize_(layer, seed, std=in_features ** -0.5)
    return layer.to(device) if device is not None else layer


@torch.no_grad()
def randomize_(module: nn.Module, seed: int = 0, std: float = 0.1) -> nn.Module:
    """Redraw every parameter of ``module`` in place from ``seed``; returns the module.

    Weights of linear and embedding layers get N(0, std²); biases N(0, 0.1²);
    LayerNorm weights 1 + N(0, 0.1²).  Tied parameters are drawn once.
    """
    g = _generator(seed)
    seen: set[int] = set()
    for mod_name, mod in module.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype).to(p.device)
            if isinstance(mod, nn.LayerNorm) and p_name == "weight":
                p.copy_(1 + 0.1 * noise)
            elif p_name == "bias":
                p.copy_(0.1 * noise)
            else:
                p.copy_(std * noise)
    return module
