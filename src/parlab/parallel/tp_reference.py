"""Single-process pieces that Lab 03 (tensor parallelism) and its checks share.

Nothing here is parallel: these are the full layers that a tensor-parallel
layer must reproduce, and tools to measure what one holds.  The students'
f/g functions, parallel layers and blocks live in their notebook.

- ``reference_linear(in, out, bias, seed)``: the full ``nn.Linear`` every rank
  builds from the same seed before keeping its shard (Megatron-LM's CPU
  initialisation does the same: Shoeybi et al. 2019, arXiv 1909.08053).  Its
  bias is random, not zero, so a bias added on every rank shows.
- ``randomize_(module, seed)``: every parameter drawn afresh (biases and
  LayerNorm weights included), for the same reason.
- ``saved_activation_bytes()``: bytes that autograd keeps for backward inside
  a block of code, the quantity Korthikanti et al. 2022 (arXiv 2205.05198)
  count as activation memory.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

__all__ = ["reference_linear", "randomize_", "saved_activation_bytes", "SavedBytes"]


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


class SavedBytes:
    """What ``saved_activation_bytes`` counted: ``bytes`` and ``tensors`` (distinct storages)."""

    def __init__(self):
        self._seen: dict[tuple, int] = {}
        self.exclude: set[tuple] = set()

    def _key(self, t: torch.Tensor) -> tuple:
        st = t.untyped_storage()
        return (str(t.device), st.data_ptr()) if st.data_ptr() else ("id", id(t))

    def _add(self, t: torch.Tensor) -> None:
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        key = self._key(t)
        if key not in self.exclude:
            self._seen[key] = max(self._seen.get(key, 0), t.untyped_storage().nbytes())

    @property
    def bytes(self) -> int:
        return sum(self._seen.values())

    @property
    def tensors(self) -> int:
        return len(self._seen)


@contextlib.contextmanager
def saved_activation_bytes(*not_counted: torch.Tensor):
    """Count the bytes autograd saves for backward inside the block.

    Each distinct storage counts once (q, k and v saving the same input count
    it once).  Tensors in ``not_counted`` (the parameters, usually) are left
    out, so what remains is activation memory::

        with saved_activation_bytes(*model.parameters()) as saved:
            loss = model(x).sum()
        saved.bytes
    """
    counter = SavedBytes()
    counter.exclude = {counter._key(t) for t in not_counted if isinstance(t, torch.Tensor)}

    def pack(t):
        counter._add(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield counter
