"""Checks for Lab 03: tensor parallelism, on the grading harness.

    lab03.check_f(CopyToParallel)                     # Exercise 1a: f
    lab03.check_g(ReduceFromParallel)                 # Exercise 1b: g
    lab03.check_column(ColumnParallelLinear)          # Exercise 2a
    lab03.check_row(RowParallelLinear)                # Exercise 2b
    lab03.check_mlp(ParallelMLP)                      # Exercise 3
    lab03.check_attention(ParallelAttention)          # Exercise 4
    lab03.check_sequence_parallel(SequenceParallelBlock)  # Exercise 5
    lab03.check_tp_bytes(tp_bytes_per_layer)          # Exercise 6 (a formula)

Every layer case builds a full reference module from a seed on each rank
(``parlab.parallel.tp_reference``: random biases and LayerNorm weights, so
a bias added on every rank shows), hands it to the student's class, runs
forward and backward against a fixed upstream gradient, and returns the
outputs, the input's gradient, and each parameter's shard and gradient.
The grader runs the same module on one process and checks that outputs,
input gradients and every parameter and gradient (shards gathered along
the dimension each one is split on) match.  The rules each exercise states
(which collectives run in forward and in backward, shards only, a
``ValueError`` when the split is uneven) are judged on the spy's records.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .. import check
from ..cost import comm_bytes, tp_comm_elems_per_layer
from . import assert_number
from .harness import Exercise, Graded, Rule, checker
from .spy import COLLECTIVES

__all__ = ["check_f", "check_g", "check_column", "check_row", "check_mlp", "check_attention",
           "check_sequence_parallel", "check_tp_bytes", "Case", "EXERCISES", "reference_module"]

TIMEOUT = 90.0
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
    from ..models.gpt import Block, GPTConfig
    from ..parallel.tp_reference import randomize_, reference_linear

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


# ---------------------------------------------------------------- test sets
_FG_VISIBLE = ((4, (Case("f", (3, 5)), Case("f", (2, 3, 4), groups="pairs"),
                    Case("f", (7,), seed=1))),)
_G_VISIBLE = ((4, (Case("g", (3, 5)), Case("g", (2, 3, 4), groups="pairs"),
                   Case("g", (7,), seed=1))),)
_COL_VISIBLE = ((4, (Case("column", (2, 3, 6), 12), Case("column", (5, 10), 8, gather=True),
                     Case("column", (3, 7), 4, bias=False), Case("column", (2, 6), 10))),)
_COL_HIDDEN = ((2, (Case("column", (4, 9), 6, seed=3), Case("column", (1, 2, 5), 14, gather=True, seed=4),
                    Case("column", (3, 4), 7, seed=5))),)
_ROW_VISIBLE = ((4, (Case("row", (2, 3, 5), 12), Case("row", (4, 6), 8, bias=False),
                     Case("row", (2, 7), 10))),)
_ROW_HIDDEN = ((2, (Case("row", (3, 2, 4), 6, seed=3), Case("row", (5, 3), 14, seed=4),
                    Case("row", (2, 3), 9, seed=5))),)
_MLP_VISIBLE = ((4, (Case("mlp", (2, 5, 6)), Case("mlp", (3, 2, 10), bias=False, seed=1))),)
_MLP_HIDDEN = ((3, (Case("mlp", (2, 4, 9), seed=2), Case("mlp", (1, 7, 6), seed=3))),)
_ATTN_VISIBLE = ((4, (Case("attn", (2, 5, 16), 4), Case("attn", (1, 7, 24), 8, bias=False, seed=1),
                      Case("attn", (2, 3, 12), 6))),)
_ATTN_HIDDEN = ((3, (Case("attn", (2, 6, 12), 3, seed=2), Case("attn", (1, 5, 30), 6, seed=3),
                     Case("attn", (2, 3, 8), 4, seed=4))),)
_SP_VISIBLE = ((2, (Case("sp", (2, 6, 8), 2), Case("sp", (1, 4, 12), 4, seed=1))),
               (4, (Case("sp", (2, 8, 8), 4), Case("sp", (1, 12, 16), 8, seed=1))),)
_SP_HIDDEN = ((3, (Case("sp", (2, 9, 12), 3, seed=2), Case("sp", (1, 6, 18), 6, seed=3))),)


# ---------------------------------------------------------------- on the ranks
def _group(case: Case):
    """The process group for a case: None (the world) or this rank's pair [2k, 2k+1]."""
    import torch.distributed as dist

    if case.groups == "world":
        return None
    n, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for start in range(0, n, 2):  # every rank creates every group, in the same order
        g = dist.new_group(list(range(start, min(start + 2, n))))
        if start <= rank < start + 2:
            mine = g
    return mine


def _cpu(t):
    return t.detach().cpu().clone() if isinstance(t, torch.Tensor) else None


def _dy_seed(case: Case, rank: int) -> int:
    """f's upstream gradients differ per rank; g's are the same on every rank, as after g in a model."""
    return 100 + 10 * case.seed + (rank if case.kind == "f" else 0)


def _run_fg(cls, case: Case, i: int, spy) -> dict:
    """f or g on this rank's x with an upstream gradient per rank; the grader sums the group."""
    import torch.distributed as dist

    from ..runtime import device

    rank = dist.get_rank()
    group = _group(case)
    x = _tensor(case.shape, 10 * case.seed + rank).to(device()).requires_grad_()
    dy = _tensor(case.shape, _dy_seed(case, rank)).to(device())
    with spy.watch():
        y = cls.apply(x * 1, group)  # x * 1: a non-leaf input, as inside a model
        spy.note("backward")
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.backward(dy)
    return {"y": _cpu(y) if isinstance(y, torch.Tensor) else repr(y)[:100], "dx": _cpu(x.grad)}


def _run_layer(cls, case: Case, i: int, spy) -> dict:
    import torch.distributed as dist

    from ..runtime import device

    rank, n = dist.get_rank(), dist.get_world_size()
    full = reference_module(case).to(device())
    kwargs = {"gather_output": True} if case.gather else {}
    if not case.divisible(n):
        try:
            with spy.watch():
                layer = cls(full, **kwargs)
        except ValueError as err:
            spy.note("uneven", raised=f"ValueError: {err}"[:300])
            return {"raised": True}
        spy.note("uneven", raised=None, shapes={k: list(p.shape) for k, p in layer.named_parameters()})
        return {"raised": False}
    x = _mine(_layer_input(case), _INPUT_SPLIT.get(case.kind), rank, n).to(device()).requires_grad_()
    with spy.watch():
        layer = cls(full, **kwargs)
        params = dict(layer.named_parameters())
        spy.note("built", numel=sum(p.numel() for p in layer.parameters()))
        y = layer(x)
        if not isinstance(y, torch.Tensor):
            return {"y": repr(y)[:100]}
        spy.note("backward")
        dy = _mine(_upstream(case), _output_split(case), rank, n).to(device())
        if y.shape == dy.shape and y.requires_grad:
            (y * dy).sum().backward()
    return {"y": _cpu(y), "dx": _cpu(x.grad), "params": {k: _cpu(p) for k, p in params.items()},
            "grads": {k: _cpu(p.grad) for k, p in params.items()}}


def _settle_layer(result: dict, case: Case, i: int, n: int) -> bool:
    """On each rank: is this rank's piece right?  (The ranks then stop a wrong answer together.)"""
    import torch.distributed as dist

    if "raised" in result:
        return result["raised"] is True
    if not isinstance(result.get("y"), torch.Tensor):
        return False
    rank, ref = dist.get_rank(), _reference(case)
    pieces = [(result["y"], _mine(ref["y"], _output_split(case), rank, n)),
              (result["dx"], _mine(ref["dx"], _INPUT_SPLIT.get(case.kind), rank, n))]
    for name, dim in _split_map(case).items():
        pieces.append((result["params"].get(name), _mine(ref["params"][name], dim, rank, n)))
        if dim is not None or case.kind != "sp":
            pieces.append((result["grads"].get(name), _mine(ref["grads"][name], dim, rank, n)))
    return all(check.same_values(got, want) for got, want in pieces)


# ---------------------------------------------------------------- the single-process reference
def _reference(case: Case) -> dict:
    full = reference_module(case)
    x = _layer_input(case).requires_grad_()
    y = full(x)
    dy = _upstream(case)
    (y * dy).sum().backward()
    named = dict(full.named_parameters())
    return {"y": y.detach(), "dx": x.grad, "params": {k: p.detach() for k, p in named.items()},
            "grads": {k: p.grad for k, p in named.items()}, "module": full, "x": x.detach()}


# ---------------------------------------------------------------- graders
def _group_sum(tensors: list, case: Case, r: int) -> torch.Tensor:
    n = len(tensors)
    members = range(n) if case.groups == "world" else range(r - r % 2, min(r - r % 2 + 2, n))
    return torch.stack([tensors[m] for m in members]).sum(0)


def _grade_fg(which: str):
    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases):
            res = g.at(i)
            xs = [_tensor(case.shape, 10 * case.seed + r) for r in range(g.n)]
            dys = [_tensor(case.shape, _dy_seed(case, r)) for r in range(g.n)]
            for r, out in enumerate(res):
                where = f"{case.describe(g.n)}, rank {r}"
                if not isinstance(out["y"], torch.Tensor):
                    return f"{g.name}.apply(x, group) returned {out['y']}, not a tensor ({where})."
                want_y = xs[r] if which == "f" else _group_sum(xs, case, r)
                want_dx = _group_sum(dys, case, r) if which == "f" else dys[r]
                size = 2 if case.groups == "pairs" else g.n
                for name, got, want in (("forward output", out["y"], want_y),
                                        ("gradient of x", out["dx"], want_dx)):
                    if got is None:
                        return (f"{g.name}: x got no gradient ({where}): backward must return the "
                                "gradient for x (and None for group).")
                    try:
                        check.assert_close(got, want, name=name, rank=r)
                    except AssertionError as err:
                        return (f"{g.name} is wrong for {where}.\n{err}\nHint: "
                                + _fg_hint(which, name, got, xs[r] if name[0] == "f" else dys[r],
                                           want, size, case))
        return None
    return grade


def _fg_hint(which: str, name: str, got, own, want, size: int, case: Case) -> str:
    group = (" Sum over the group you are given (here each pair of ranks), not the whole world: "
             "pass group=group to dist.all_reduce." if case.groups == "pairs" else "")
    if which == "f" and name == "forward output":
        return ("f's forward is the identity: return x as it is. Summing in forward is g's job "
                "(did you swap f and g?).")
    if which == "g" and name == "gradient of x":
        if check.same_values(got, size * want):
            return (f"the gradient is {size} x the upstream gradient: g's backward is the identity "
                    "(the all-reduce in backward is f's; did you swap f and g?).")
        return "g's backward returns the upstream gradient unchanged."
    if check.same_values(got, own):
        return ("this rank's own value came back unchanged: the all-reduce is missing"
                + (" in backward (f's backward sums the gradient over the group)." if which == "f"
                   else " in forward (g's forward sums x over the group).") + group)
    return "the sum must run over the ranks of `group`." + group


def _named_mismatch(what: str, got: dict, want: dict, split: dict, n: int, summed: bool) -> str | None:
    """Compare parameters or gradients per name: shards reassemble, replicated ones match."""
    for name, dim in split.items():
        per_rank = [g.get(name) for g in got]
        if any(p is None for p in per_rank):
            r = next(r for r, p in enumerate(per_rank) if p is None)
            if what == "parameter":
                return (f"rank {r}'s layer has no parameter named '{name}': keep the attribute "
                        f"names of the reference ({', '.join(split)}).")
            return f"'{name}' got no gradient on rank {r}: is it used in forward?"
        try:
            if dim is not None:
                check.assert_shards_reassemble(per_rank, want[name], dim=dim, name=f"{name} {what}",
                                               world_size=n)
            elif summed and what == "gradient":
                check.assert_close(torch.stack(per_rank).sum(0), want[name],
                                   name=f"{name} gradient summed over the ranks")
            else:
                for r, p in enumerate(per_rank):
                    check.assert_close(p, want[name], name=f"{name} {what}", rank=r)
        except AssertionError as err:
            return f"{err}" + _split_hint(name, dim, per_rank, want[name], what, n)
    return None


def _split_hint(name, dim, per_rank, full, what, n) -> str:
    if dim is None or not isinstance(per_rank[0], torch.Tensor) or what != "parameter":
        return ""
    other = 1 - dim
    if per_rank[0].dim() == 2 and per_rank[0].shape[other] * n == full.shape[other]:
        kind = "output" if dim == 0 else "input"
        return (f"\nHint: you split the wrong dimension: '{name}' is split along dim {other}. "
                f"nn.Linear's weight is (out_features, in_features); this layer splits the {kind} "
                f"features, dim {dim}.")
    return ""


def _grade_layer(g: Graded) -> str | None:
    done = min(len(r) for r in g.results)
    for i, case in enumerate(g.cases[:done]):
        res = g.at(i)
        if not case.divisible(g.n):
            continue  # judged by the rule on uneven splits
        where = case.describe(g.n)
        bad = [(r, o) for r, o in enumerate(res) if not isinstance(o.get("y"), torch.Tensor)]
        if bad:
            return f"{g.name}'s forward returned {bad[0][1]['y']} on rank {bad[0][0]}, not a tensor ({where})."
        ref = _reference(case)
        split = _split_map(case)
        message = _named_mismatch("parameter", [o["params"] for o in res], ref["params"], split, g.n, False)
        if message:
            return f"{g.name}'s shards are wrong for {where}.\n{message}"
        records = [per_rank[i] for per_rank in g.records]
        message = (_output_mismatch(case, [o["y"] for o in res], ref, g.n, "y", records)
                   or _output_mismatch(case, [o["dx"] for o in res], ref, g.n, "dx", records))
        if message:
            return f"{g.name} is wrong for {where}.\n{message}"
        message = _named_mismatch("gradient", [o["grads"] for o in res], ref["grads"], split, g.n,
                                  summed=case.kind == "sp")
        if message:
            return f"{g.name}'s parameter gradients are wrong for {where}.\n{message}"
    return None


def _output_mismatch(case: Case, got: list, ref: dict, n: int, key: str, records: list) -> str | None:
    want = ref[key]
    name = "output" if key == "y" else "gradient of the input"
    dim = _output_split(case) if key == "y" else _INPUT_SPLIT.get(case.kind)
    if any(t is None for t in got):
        r = next(r for r, t in enumerate(got) if t is None)
        return (f"the input got no gradient on rank {r}: did backward reach it? A collective's result "
                "has no gradient of its own (wrap the collective in an autograd Function, as f and g "
                "do), and detaching or torch.tensor() cuts the graph too.")
    try:
        if dim is not None:
            check.assert_shards_reassemble(got, want, dim=dim, name=name, world_size=n)
        else:
            for r, t in enumerate(got):
                check.assert_close(t, want, name=name, rank=r)
    except AssertionError as err:
        hint = _layer_hint(case, got, ref, n, key, records)
        return f"{err}" + (f"\nHint: {hint}" if hint else "")
    return None


def _layer_hint(case: Case, got: list, ref: dict, n: int, key: str, records: list) -> str:
    """A guess at the mistake behind a wrong output or input gradient (never raises)."""
    want = ref[key]
    shapes_ok = all(isinstance(t, torch.Tensor) and t.shape == want.shape for t in got)
    bias = ref["params"].get(_OUTPUT_BIAS.get(case.kind, ""), torch.zeros(()))
    if key == "y" and case.bias and shapes_ok and case.kind in _OUTPUT_BIAS:
        if all(check.same_values(t, want + (n - 1) * bias) for t in got):
            return (f"the output has the bias {n} times: every rank added it before the all-reduce "
                    "summed them. Add the bias once, after the all-reduce.")
    if shapes_ok and key == "dx" and check.same_values(torch.stack(got).sum(0), want):
        return ("the input's gradient on each rank is only that rank's part, and they add up to the "
                "right one: the all-reduce in backward (f's backward) is missing.")
    if shapes_ok and key == "y" and check.same_values(torch.stack(got).sum(0) - (n - 1) * bias, want):
        return "each rank returned its partial sum: the all-reduce in forward (g) is missing."
    if shapes_ok and all(check.same_values(t, n * want) for t in got):
        return f"every rank holds {n} x the right {'output' if key == 'y' else 'gradient'}: summed once too often (f and g swapped?)."
    if case.kind == "sp" and key == "y":
        return _sp_hint(case, got, ref, n, records)
    if case.kind == "attn" and key == "y":
        return ("check the head split: rank r holds heads r·n_head/t to (r+1)·n_head/t − 1, which are "
                "rows r·d_model/t to (r+1)·d_model/t − 1 of q, k and v's weights. Reshape each shard "
                "to (B, T, n_head/t, head_dim), with head_dim unchanged, before attention.")
    return ""


#: The bias added after the all-reduce, per kind.
_OUTPUT_BIAS = {"row": "bias", "mlp": "down.bias", "attn": "o.bias"}


_SP_GATHER = ("attention ran without the other positions. All-gather the sequence (after the "
              "LayerNorm) before attention and before the MLP, and reduce-scatter after.")


def _sp_hint(case: Case, got: list, ref: dict, n: int, records: list) -> str:
    for r, rec in enumerate(records):
        first = next((c["op"] for c in _calls(rec, False)), None)
        if first not in GATHERS:
            return (f"rank {r}'s first collective in forward was {first or 'none'}, not an all-gather: "
                    + _SP_GATHER)
    block, x = ref["module"], ref["x"]
    with torch.no_grad():
        alone = [block(chunk) for chunk in x.chunk(n, dim=1)]
    for r, t in enumerate(got):
        if isinstance(t, torch.Tensor) and t.shape == alone[r].shape and check.same_values(t, alone[r]):
            return f"rank {r}'s output is what the block gives for its part of the sequence alone: " + _SP_GATHER
    return ""


# ---------------------------------------------------------------- rules
def _calls(rec: dict, backward: bool) -> list[dict]:
    return [c for c in rec["calls"] if c["in_backward"] == backward]


def _fg_rule(which: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            forward, backward = _calls(rec, False), _calls(rec, True)
            want_fwd, want_bwd = (0, 1) if which == "f" else (1, 0)
            wrong = [c["op"] for c in rec["calls"] if c["op"] != "all_reduce"]
            if wrong:
                return f"rank {r} called dist.{wrong[0]}."
            if len(forward) != want_fwd or len(backward) != want_bwd:
                return (f"rank {r} made {len(forward)} all-reduce(s) in forward and {len(backward)} in "
                        f"backward; {which} makes {want_fwd} and {want_bwd}.")
        return None
    return broken


def _event(rec: dict, name: str) -> dict | None:
    return next((e for e in rec["events"] if e["event"] == name), None)


def _shards_only(records, case, n):
    if not case.divisible(n):
        return None
    full = sum(p.numel() for p in reference_module(case).parameters())
    replicated = sum(p.numel() for k, p in reference_module(case).named_parameters()
                     if _split_map(case).get(k, 0) is None)
    want = replicated + (full - replicated) // n
    for r, rec in enumerate(records):
        built = _event(rec, "built")
        if built and built["numel"] != want:
            return (f"rank {r}'s layer holds {built['numel']} parameter elements; its shard is {want} "
                    f"({'the full layer has ' + str(full) if built['numel'] >= full else 'check what it registers'}).")
    return None


def _uneven_raises(what: str):
    def broken(records, case, n):
        if case.divisible(n):
            return None
        for r, rec in enumerate(records):
            seen = _event(rec, "uneven")
            if seen is None:
                continue
            if seen["raised"] is None:
                return (f"rank {r} accepted {what} {case.features} on {n} ranks, which does not divide "
                        f"evenly (its parameters: {seen['shapes']}); raise a ValueError that says "
                        f"{what} must be divisible by the number of ranks. Unequal shards break the "
                        "all-gathers of equal pieces and the even split of the work.")
            if "divisible" not in seen["raised"]:
                return (f"rank {r} raised {seen['raised']!r} for {what} {case.features} on {n} ranks: "
                        "right, but say what is wrong with the word 'divisible' (for example "
                        "'out_features 10 is not divisible by 4 ranks').")
        return None
    return broken


def _forward_ops(records, case, n, allowed) -> str | None:
    for r, rec in enumerate(records):
        for c in _calls(rec, False):
            if c["op"] not in allowed:
                return f"rank {r} called dist.{c['op']} in forward."
    return None


def _column_comm(records, case, n):
    if not case.divisible(n):
        return None
    shape = case.shape[:-1] + (case.features // n,)
    ok = {math.prod(shape), math.prod(shape) * n}
    for r, rec in enumerate(records):
        fwd = _calls(rec, False)
        if not case.gather and fwd:
            return f"rank {r} called dist.{fwd[0]['op']} in forward, with gather_output=False."
        for c in fwd:
            if c["op"] not in GATHERS or c["numel"] not in ok:
                return (f"rank {r} called dist.{c['op']} on {c['numel']} elements in forward; the "
                        f"only gather is the output's ({math.prod(shape)} elements per rank).")
        bwd = _calls(rec, True)
        if [c["op"] for c in bwd] != ["all_reduce"]:
            return (f"rank {r} made {[c['op'] for c in bwd]} in backward; exactly one all-reduce, "
                    "of the input's gradient.")
    return None


def _one_each(fwd_ops, bwd_ops, what):
    def broken(records, case, n):
        if not case.divisible(n):
            return None
        for r, rec in enumerate(records):
            fwd = [c["op"] for c in _calls(rec, False)]
            bwd = [c["op"] for c in _calls(rec, True)]
            if fwd != fwd_ops or bwd != bwd_ops:
                return (f"rank {r} made {fwd or 'no collective'} in forward and {bwd or 'no collective'} "
                        f"in backward; {what}.")
        return None
    return broken


def _sp_comm(records, case, n):
    for r, rec in enumerate(records):
        ops = [c["op"] for c in rec["calls"]]
        if "all_reduce" in ops:
            return f"rank {r} called dist.all_reduce."
        odd = [op for op in ops if op not in GATHERS + SCATTERS]
        if odd:
            return f"rank {r} called dist.{odd[0]}."
    return None


def _sp_counts(records, case, n):
    for r, rec in enumerate(records):
        for backward in (False, True):
            calls = _calls(rec, backward)
            gathers = sum(c["op"] in GATHERS for c in calls)
            scatters = sum(c["op"] in SCATTERS for c in calls)
            if (gathers, scatters) != (2, 2):
                phase = "backward" if backward else "forward"
                return (f"rank {r} made {gathers} all-gather(s) and {scatters} reduce-scatter(s) in "
                        f"{phase}: gather the LayerNorm's output once for q, k and v together.")
    return None


SHARDS_SAYS = "Keep only this rank's shard of each split weight and bias: no full copy of the layer."


def _uneven_says(what: str) -> str:
    return (f"If {what} is not divisible by the number of ranks, raise a `ValueError` that says so "
            "(no unequal shards).")


def _grade_with_uneven(what: str):
    """Uneven cases first (did it refuse?), then the layer's values."""
    judge = _uneven_raises(what)

    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases[:min(len(r) for r in g.records)]):
            problem = judge([per_rank[i] for per_rank in g.records], case, g.n)
            if problem:
                return f"{g.name} is wrong for {case.describe(g.n)}: {problem}"
        return _grade_layer(g)
    return grade


# ---------------------------------------------------------------- byte prediction (a formula)
_BYTES_VISIBLE = ((1, ((3, 7, 5, 4, 4), (4, 1024, 4096, 8, 2), (1, 32, 64, 2, 2))),)
_BYTES_HIDDEN = ((1, ((2, 2048, 8192, 4, 2), (5, 11, 13, 3, 4), (1, 1, 1, 1, 2))),)


def _run_bytes(fn, case, i, spy):
    from .numbers import plain_number

    b, s, h, t, k = case
    with spy.watch():
        got = fn(b, s, h, t, k)
    return plain_number(got)


def _grade_bytes(g: Graded) -> str | None:
    for i, (b, s, h, t, k) in enumerate(g.cases[:len(g.results[0])]):
        want = comm_bytes(tp_comm_elems_per_layer(b, s, h, t), k)
        call = f"tp_bytes_per_layer(b={b}, s={s}, h={h}, t={t}, bytes_per_element={k})"
        mistakes = [(want / 2, "That is half: count backward too (two all-reduces in forward, two in "
                               "backward)."),
                    (want * 2, "That is twice too much: f and g each make ONE all-reduce per "
                               "sublayer, two per layer in forward and two in backward."),
                    (8 * b * s * h * k if t > 1 else -1.0,
                     "The ring factor (t − 1)/t is missing: a ring all-reduce sends 2(t − 1)/t "
                     "of the tensor per rank."),
                    (want * 8, "That is 8x too large: bits instead of bytes?"),
                    (want / k, "That is the number of elements: multiply by bytes_per_element.")]
        try:
            assert_number(g.results[0][i], want, call, mistakes, unit="bytes")
        except AssertionError as err:
            return str(err)
    return None


# ---------------------------------------------------------------- the exercises
def _ex(key, answer, run, grade, visible, hidden, rules=(), **kw) -> Exercise:
    settle = _settle_layer if run is _run_layer else None
    return Exercise(key=f"lab03.{key}", answer=answer, run=run, grade=grade, visible=visible,
                    hidden=hidden, rules=rules, timeout=TIMEOUT, kind="class", settle=settle, **kw)


def _shape_error(text: str) -> str:
    if "cannot be multiplied" in text or "size of tensor" in text or "shape" in text:
        return ("the weight shard does not fit the input: did you split the wrong dimension? "
                "nn.Linear's weight is (out_features, in_features): a column-parallel layer keeps "
                "rows (dim 0), a row-parallel layer keeps columns (dim 1) and gets this rank's slice "
                "of the input features.")
    return ""


_HANG = ("every rank of the group must make the same collectives in the same order: is a collective "
         "skipped on some ranks, or made with a different group?")

F_EX = _ex("f", "CopyToParallel", _run_fg, _grade_fg("f"), _FG_VISIBLE, (),
           (Rule("f makes exactly one `dist.all_reduce`, in backward, on `group`; no other collective.",
                 _fg_rule("f")),), on_hang=_HANG)
G_EX = _ex("g", "ReduceFromParallel", _run_fg, _grade_fg("g"), _G_VISIBLE, (),
           (Rule("g makes exactly one `dist.all_reduce`, in forward, on `group`; no other collective.",
                 _fg_rule("g")),), on_hang=_HANG)
COLUMN = _ex("column", "ColumnParallelLinear", _run_layer, _grade_with_uneven("out_features"),
             _COL_VISIBLE, _COL_HIDDEN,
             (Rule(SHARDS_SAYS, _shards_only),
              Rule("No all-gather of the full weight: forward communicates only to gather the output "
                   "(with `gather_output=True`), and backward makes one all-reduce.", _column_comm),
              Rule(_uneven_says("`out_features`"), _uneven_raises("out_features"))), on_hang=_HANG,
             on_error=_shape_error)
ROW = _ex("row", "RowParallelLinear", _run_layer, _grade_with_uneven("in_features"),
          _ROW_VISIBLE, _ROW_HIDDEN,
          (Rule(SHARDS_SAYS, _shards_only),
           Rule("Forward makes exactly one all-reduce (of the output); backward makes none.",
                _one_each(["all_reduce"], [], "one all-reduce in forward, none in backward")),
           Rule(_uneven_says("`in_features`"), _uneven_raises("in_features"))), on_hang=_HANG,
          on_error=_shape_error)
_MLP_COMM = Rule("One all-reduce in forward and one in backward, and no other collective (no "
                 "all-gather of the full weight).",
                 _one_each(["all_reduce"], ["all_reduce"], "one all-reduce in each"))
MLP = _ex("mlp", "ParallelMLP", _run_layer, _grade_layer, _MLP_VISIBLE, _MLP_HIDDEN,
          (Rule(SHARDS_SAYS, _shards_only), _MLP_COMM), on_hang=_HANG)
ATTENTION = _ex("attn", "ParallelAttention", _run_layer, _grade_with_uneven("n_head"),
                _ATTN_VISIBLE, _ATTN_HIDDEN,
                (Rule(SHARDS_SAYS, _shards_only), _MLP_COMM,
                 Rule(_uneven_says("`n_head`"), _uneven_raises("n_head"))), on_hang=_HANG)
SEQUENCE = _ex("sp", "SequenceParallelBlock", _run_layer, _grade_layer, _SP_VISIBLE, _SP_HIDDEN,
               (Rule("No all-reduce: communicate only with all-gathers and reduce-scatters along the "
                     "sequence.", _sp_comm),
                Rule("Gather once before attention and once before the MLP: two all-gathers and two "
                     "reduce-scatters in forward, and two of each in backward.", _sp_counts)),
               on_hang=_HANG)
BYTES = Exercise(key="lab03.bytes", answer="tp_bytes_per_layer", run=_run_bytes, grade=_grade_bytes,
                 visible=_BYTES_VISIBLE, hidden=_BYTES_HIDDEN, solo=True)

EXERCISES = {"f": F_EX, "g": G_EX, "column": COLUMN, "row": ROW, "mlp": MLP, "attn": ATTENTION,
             "sp": SEQUENCE, "bytes": BYTES}

check_f = checker(F_EX, """Exercise 1a: ``cls.apply(x, group)`` is the identity in forward and
all-reduces the gradient over ``group`` in backward.""")
check_g = checker(G_EX, """Exercise 1b: ``cls.apply(x, group)`` all-reduces x over ``group`` in
forward and passes the gradient through in backward.""")
check_column = checker(COLUMN, """Exercise 2a: ``cls(linear, gather_output=False, group=None)``
keeps rows of the weight; its output is this rank's columns (all of them with gather_output).""")
check_row = checker(ROW, """Exercise 2b: ``cls(linear, group=None)`` keeps columns of the weight,
takes this rank's slice of the input features and returns the full output.""")
check_mlp = checker(MLP, """Exercise 3: ``cls(mlp, group=None)`` is parlab's MLP, column- then
row-parallel.""")
check_attention = checker(ATTENTION, """Exercise 4: ``cls(attn, group=None)`` is parlab's attention
with the heads split across ranks.""")
check_sequence_parallel = checker(SEQUENCE, """Exercise 5: ``cls(block, group=None)`` runs a
transformer block on this rank's part of the sequence.""")
check_tp_bytes = checker(BYTES, """Exercise 6: ``fn(b, s, h, t, bytes_per_element)`` is the number
of bytes each rank sends per layer per step under Megatron TP.""")
