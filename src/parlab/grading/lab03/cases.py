"""Lab 03's test cases and the single-process reference they are judged against.

A ``Case`` names a layer kind and its sizes; ``reference_module(case)`` is the
full module every rank builds from the case's seed (float64, random biases
and LayerNorm weights, from ``parlab.parallel.tp_reference``), and
``reference(case)`` runs it on one process: output, input gradient,
parameters and their gradients.  ``SPLIT`` says along which dimension each
parameter is sharded (None: whole on every rank).  Used by ``lab03`` (the
ranks) and ``rules`` (the grader).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")


@dataclass(frozen=True)
class Case:
    """One test input.

    ``shape`` is the input's shape (the last dimension is the layer's input
    features; for "sp" the input is (batch, seq, d_model) before it is split
    along the sequence).  ``features`` is the dimension that gets split:
    out_features for "column", in_features for "row", the heads for "attn".
    ``groups`` ("world" or "pairs") is the process group f and g are given.
    """

    kind: str
    shape: tuple = (2, 3, 8)
    features: int = 12
    bias: bool = True
    gather: bool = False
    groups: str = "world"
    seed: int = 0

    def describe(self, n: int) -> str:
        what = {"f": "f", "g": "g", "column": f"out_features {self.features}",
                "row": f"in_features {self.features}", "mlp": f"d_model {self.shape[-1]}",
                "attn": f"n_head {self.features}, d_model {self.shape[-1]}",
                "sp": f"n_head {self.features}, d_model {self.shape[-1]}"}[self.kind]
        extra = (", gather_output=True" if self.gather else "") + ("" if self.bias else ", bias=False")
        group = ", groups of 2 ranks" if self.groups == "pairs" else ""
        return f"input shape {self.shape}, {what}{extra}{group}, world_size {n}"

    def divisible(self, n: int) -> bool:
        return self.kind in ("f", "g", "mlp") or self.features % n == 0


def _tensor(shape, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def reference_module(case: Case) -> nn.Module:
    """The full module a case hands to the student's class (on the CPU, float64).

    float64, because a float32 gradient that is a small sum of large terms
    differs from the single-process one by more than float32 tolerances once
    the ranks add the terms in another order.
    """
    return _reference_module(case).double()


def _reference_module(case: Case) -> nn.Module:
    from ...models.gpt import Block, GPTConfig
    from ...parallel.tp_reference import randomize_, reference_linear

    h = case.shape[-1]
    if case.kind == "column":
        return reference_linear(h, case.features, case.bias, seed=case.seed)
    if case.kind == "row":
        return reference_linear(case.features, h, case.bias, seed=case.seed)
    heads = case.features if case.kind in ("attn", "sp") else 1
    block = Block(GPTConfig(d_model=h, n_head=heads, bias=case.bias, n_layer=2))
    randomize_(block, seed=case.seed, std=h ** -0.5)
    return {"mlp": block.mlp, "attn": block.attn}.get(case.kind, block)


def _layer_input(case: Case) -> torch.Tensor:
    shape = case.shape[:-1] + (case.features,) if case.kind == "row" else case.shape
    return _tensor(shape, 1000 + case.seed)


def _out_shape(case: Case) -> tuple:
    return case.shape[:-1] + (case.features,) if case.kind == "column" else case.shape


def _upstream(case: Case) -> torch.Tensor:
    return _tensor(_out_shape(case), 2000 + case.seed)


#: Per kind: parameter name -> dimension it is split on (None: replicated).
_SPLIT = {
    "column": {"weight": 0, "bias": 0},
    "row": {"weight": 1, "bias": None},
    "mlp": {"up.weight": 0, "up.bias": 0, "down.weight": 1, "down.bias": None},
    "attn": {f"{p}.{w}": 0 for p in "qkv" for w in ("weight", "bias")} | {"o.weight": 1, "o.bias": None},
}
_SPLIT["sp"] = ({f"{ln}.{w}": None for ln in ("ln1", "ln2") for w in ("weight", "bias")}
                | {f"attn.{k}": v for k, v in _SPLIT["attn"].items()}
                | {f"mlp.{k}": v for k, v in _SPLIT["mlp"].items()})
#: Where the input and the output are split (dimension), None: every rank holds all of it.
_INPUT_SPLIT = {"row": -1, "sp": 1}


def _split_map(case: Case) -> dict:
    return {k: v for k, v in _SPLIT[case.kind].items() if case.bias or not k.endswith(".bias") and k != "bias"}


def _output_split(case: Case):
    if case.kind == "column" and not case.gather:
        return -1
    return 1 if case.kind == "sp" else None


def _mine(t: torch.Tensor, dim, rank: int, n: int) -> torch.Tensor:
    return t if dim is None else t.chunk(n, dim=dim)[rank].contiguous()


def _dy_seed(case: Case, rank: int) -> int:
    """f's upstream gradients differ per rank; g's are the same on every rank, as after g in a model."""
    return 100 + 10 * case.seed + (rank if case.kind == "f" else 0)


def reference(case: Case) -> dict:
    full = reference_module(case)
    x = _layer_input(case).requires_grad_()
    y = full(x)
    dy = _upstream(case)
    (y * dy).sum().backward()
    named = dict(full.named_parameters())
    return {"y": y.detach(), "dx": x.grad, "params": {k: p.detach() for k, p in named.items()},
            "grads": {k: p.grad for k, p in named.items()}, "module": full, "x": x.detach()}
