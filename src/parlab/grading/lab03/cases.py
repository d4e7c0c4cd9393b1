"""Lab 03's test cases and the single-process reference they are judged against.

A ``Case`` names a layer kind and its sizes; ``reference_module(case)`` is the
full module every rank builds from the case's seed (float64, random biases
and LayerNorm weights, from ``parlab.parallel.tp_reference``), and
``reference(case)`` runs it on one process: output, input gradient,
parameters and their gradients.  ``split_map(case)`` says along which
dimension each parameter is sharded (None: whole on every rank), and
``mine`` cuts this rank's shard of a full tensor.  Used by every exercise
module, on the ranks and in the graders, with the launch's ``TIMEOUT`` and
the ``HANG`` hint every exercise gives when the ranks waited for each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

TIMEOUT = 90.0
HANG = ("every rank of the group must make the same collectives in the same order: is a collective "
        "skipped on some ranks, or made with a different group?")


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


def team(case: Case, n: int, rank: int) -> list[int]:
    """The ranks of ``rank``'s group for a case: every rank, or its pair [2k, 2k+1]."""
    if case.groups == "world":
        return list(range(n))
    return list(range(rank - rank % 2, min(rank - rank % 2 + 2, n)))


def teams(case: Case, n: int) -> list[list[int]]:
    """The case's groups, each once, in order."""
    return [team(case, n, r) for r in range(n) if team(case, n, r)[0] == r]


def process_group(case: Case):
    """On a rank: the process group for a case, None (the world) or this rank's pair [2k, 2k+1]."""
    import torch.distributed as dist

    if case.groups == "world":
        return None
    n, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for members in teams(case, n):  # every rank creates every group, in the same order
        g = dist.new_group(members)
        if rank in members:
            mine = g
    return mine


def seeded_tensor(shape, seed: int) -> torch.Tensor:
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


def layer_input(case: Case) -> torch.Tensor:
    shape = case.shape[:-1] + (case.features,) if case.kind == "row" else case.shape
    return seeded_tensor(shape, 1000 + case.seed)


def _out_shape(case: Case) -> tuple:
    return case.shape[:-1] + (case.features,) if case.kind == "column" else case.shape


def upstream(case: Case) -> torch.Tensor:
    return seeded_tensor(_out_shape(case), 2000 + case.seed)


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
#: Where the input is split (dimension), per kind; absent: every rank holds all of it.
#: row: (..., in/n), this rank's slice of the input features; sp: (b, s/n, h), its positions.
INPUT_SPLIT = {"row": -1, "sp": 1}


def split_map(case: Case) -> dict:
    return {k: v for k, v in _SPLIT[case.kind].items() if case.bias or not k.endswith(".bias") and k != "bias"}


def output_split(case: Case):
    """column: (..., out/n) unless gathered; sp: (b, s/n, h); else None, the full output on every rank."""
    if case.kind == "column" and not case.gather:
        return -1
    return 1 if case.kind == "sp" else None


def mine(t: torch.Tensor, dim, rank: int, n: int) -> torch.Tensor:
    """This rank's shard of ``t``: its size along ``dim`` divided by n (all of ``t`` when dim is None)."""
    return t if dim is None else t.chunk(n, dim=dim)[rank].contiguous()


def reference(case: Case) -> dict:
    full = reference_module(case)
    x = layer_input(case).requires_grad_()
    y = full(x)
    dy = upstream(case)
    (y * dy).sum().backward()
    named = dict(full.named_parameters())
    return {"y": y.detach(), "dx": x.grad, "params": {k: p.detach() for k, p in named.items()},
            "grads": {k: p.grad for k, p in named.items()}, "module": full, "x": x.detach()}
