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

This module holds the test sets, what runs on the ranks and the exercise
declarations; ``cases`` the cases and the reference, ``rules``
the graders, hints and rules.
"""
from __future__ import annotations

import contextlib

import torch

from ... import check
from ..harness import Exercise, Rule, checker
from .cases import Case, _dy_seed, _INPUT_SPLIT, _layer_input, _mine, _output_split, _split_map, \
    _tensor, _upstream, reference, reference_module
from ..calls import NO_COST_SAYS, no_cost_calls, watched_cost_call
from .rules import (SHARDS_SAYS, _column_comm, _fg_rule, _grade_bytes, _grade_fg,
                          _grade_layer, _grade_with_uneven, _inplace, _local_norm, _one_each,
                          _shape_error, _shards_only, _sp_comm, _sp_counts, _uneven_raises, _uneven_says)

__all__ = ["check_f", "check_g", "check_column", "check_row", "check_mlp", "check_attention",
           "check_sequence_parallel", "check_tp_bytes", "Case", "EXERCISES", "reference_module"]

TIMEOUT = 90.0


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
_SP_VISIBLE = ((4, (Case("sp", (2, 8, 8), 4), Case("sp", (1, 12, 16), 8, seed=1),
                    Case("sp", (1, 4, 12), 4, seed=4))),)
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


def _run_fg(cls, case: Case, i: int, spy) -> dict:
    """f or g on this rank's x with an upstream gradient per rank; the grader sums the group."""
    import torch.distributed as dist

    from ...launch.runtime import device

    rank = dist.get_rank()
    group = _group(case)
    x = _tensor(case.shape, 10 * case.seed + rank).to(device()).requires_grad_()
    dy = _tensor(case.shape, _dy_seed(case, rank)).to(device())
    inp = x * 1  # a non-leaf input, as inside a model
    spy.guard(x=inp, dy=dy)
    with spy.watch():
        y = cls.apply(inp, group)
        spy.note("backward")
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.backward(dy)
    return {"y": _cpu(y) if isinstance(y, torch.Tensor) else repr(y)[:100], "dx": _cpu(x.grad)}


def _run_layer(cls, case: Case, i: int, spy) -> dict:
    import torch.distributed as dist

    from ...launch.runtime import device

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
    dy = _mine(_upstream(case), _output_split(case), rank, n).to(device())
    norms: list = []
    with spy.watch(), _layer_norm_inputs(norms if case.kind == "sp" else None):
        layer = cls(full, **kwargs)
        params = dict(layer.named_parameters())
        spy.note("built", numel=sum(p.numel() for p in layer.parameters()),
                 storage={k: [p.numel() * p.element_size(), p.untyped_storage().nbytes()]
                          for k, p in params.items()})
        y = layer(x)
        if not isinstance(y, torch.Tensor):
            return {"y": repr(y)[:100]}
        spy.note("backward")
        if y.shape == dy.shape and y.requires_grad:
            (y * dy.detach()).sum().backward()
    if norms:
        spy.note("layer_norm", shapes=norms)
    return {"y": _cpu(y), "dx": _cpu(x.grad), "params": {k: _cpu(p) for k, p in params.items()},
            "grads": {k: _cpu(p.grad) for k, p in params.items()}}


@contextlib.contextmanager
def _layer_norm_inputs(shapes: list | None):
    """Record the input shape of every ``F.layer_norm`` call (``nn.LayerNorm`` makes one)."""
    import torch.nn.functional as F

    if shapes is None:
        yield
        return
    original = F.layer_norm

    def recorded(inp, *args, **kwargs):
        shapes.append(list(inp.shape))
        return original(inp, *args, **kwargs)

    F.layer_norm = recorded
    try:
        yield
    finally:
        F.layer_norm = original


def _settle_layer(result: dict, case: Case, i: int, n: int) -> bool:
    """On each rank: is this rank's piece right?  (The ranks then stop a wrong answer together.)"""
    import torch.distributed as dist

    if "raised" in result:
        return result["raised"] is True
    if not isinstance(result.get("y"), torch.Tensor):
        return False
    rank, ref = dist.get_rank(), reference(case)
    pieces = [(result["y"], _mine(ref["y"], _output_split(case), rank, n)),
              (result["dx"], _mine(ref["dx"], _INPUT_SPLIT.get(case.kind), rank, n))]
    for name, dim in _split_map(case).items():
        pieces.append((result["params"].get(name), _mine(ref["params"][name], dim, rank, n)))
        if dim is not None or case.kind != "sp":
            pieces.append((result["grads"].get(name), _mine(ref["grads"][name], dim, rank, n)))
    return all(check.same_values(got, want) for got, want in pieces)


# ---------------------------------------------------------------- byte prediction (a formula)
_BYTES_VISIBLE = ((1, ((3, 7, 5, 4, 4), (4, 1024, 4096, 8, 2), (1, 32, 64, 2, 2))),)
_BYTES_HIDDEN = ((1, ((2, 2048, 8192, 4, 2), (5, 11, 13, 3, 4), (1, 1, 1, 1, 2))),)


def _run_bytes(fn, case, i, spy):
    from ..numbers import plain_number

    return plain_number(watched_cost_call(spy, fn, *case))


# ---------------------------------------------------------------- the exercises
def _ex(key, answer, run, grade, visible, hidden, rules=(), **kw) -> Exercise:
    settle = _settle_layer if run is _run_layer else None
    return Exercise(key=f"lab03.{key}", answer=answer, run=run, grade=grade, visible=visible,
                    hidden=hidden, rules=rules, timeout=TIMEOUT, kind="class", settle=settle, **kw)


_NOT_IN_PLACE_FG = Rule("Do not modify the incoming tensor in place: forward leaves `x` and backward "
                        "leaves the incoming gradient as they came (all-reduce a copy).", _inplace)
_HANG = ("every rank of the group must make the same collectives in the same order: is a collective "
         "skipped on some ranks, or made with a different group?")

F_EX = _ex("f", "CopyToParallel", _run_fg, _grade_fg("f"), _FG_VISIBLE, (),
           (Rule("f makes exactly one `dist.all_reduce`, in backward, on `group`; no other collective.",
                 _fg_rule("f")), _NOT_IN_PLACE_FG), on_hang=_HANG)
G_EX = _ex("g", "ReduceFromParallel", _run_fg, _grade_fg("g"), _G_VISIBLE, (),
           (Rule("g makes exactly one `dist.all_reduce`, in forward, on `group`; no other collective.",
                 _fg_rule("g")), _NOT_IN_PLACE_FG), on_hang=_HANG)
COLUMN = _ex("column", "ColumnParallelLinear", _run_layer, _grade_with_uneven("out_features"),
             _COL_VISIBLE, _COL_HIDDEN,
             (Rule(SHARDS_SAYS, _shards_only),
              Rule("No all-gather of the full weight: forward communicates only to gather the output "
                   "(with `gather_output=True`), and backward makes one all-reduce.", _column_comm),
              Rule(_uneven_says("`out_features`"), _uneven_raises("out_features"))),
             on_hang=_HANG,
             on_error=_shape_error)
ROW = _ex("row", "RowParallelLinear", _run_layer, _grade_with_uneven("in_features"),
          _ROW_VISIBLE, _ROW_HIDDEN,
          (Rule(SHARDS_SAYS, _shards_only),
           Rule("Forward makes exactly one all-reduce (of the output); backward makes none.",
                _one_each(["all_reduce"], [], "one all-reduce in forward, none in backward")),
           Rule(_uneven_says("`in_features`"), _uneven_raises("in_features"))),
          on_hang=_HANG,
          on_error=_shape_error)
_MLP_COMM = Rule("One all-reduce in forward and one in backward, and no other collective (no "
                 "all-gather of the full weight).",
                 _one_each(["all_reduce"], ["all_reduce"], "one all-reduce in each"))
MLP = _ex("mlp", "ParallelMLP", _run_layer, _grade_layer, _MLP_VISIBLE, _MLP_HIDDEN,
          (Rule(SHARDS_SAYS, _shards_only), _MLP_COMM), on_hang=_HANG)
ATTENTION = _ex("attn", "ParallelAttention", _run_layer, _grade_with_uneven("n_head"),
                _ATTN_VISIBLE, _ATTN_HIDDEN,
                (Rule(SHARDS_SAYS, _shards_only), _MLP_COMM,
                 Rule(_uneven_says("`n_head`"), _uneven_raises("n_head"))),
                on_hang=_HANG)
SEQUENCE = _ex("sp", "SequenceParallelBlock", _run_layer, _grade_layer, _SP_VISIBLE, _SP_HIDDEN,
               (Rule("No all-reduce: communicate only with all-gathers and reduce-scatters along the "
                     "sequence.", _sp_comm),
                Rule("Gather once before attention and once before the MLP: two all-gathers and two "
                     "reduce-scatters in forward, and two of each in backward.", _sp_counts),
                Rule("Run each LayerNorm on this rank's own T/t positions, before the all-gather: "
                     "not on the gathered sequence.", _local_norm)),
               on_hang=_HANG)
BYTES = Exercise(key="lab03.bytes", answer="tp_bytes_per_layer", run=_run_bytes, grade=_grade_bytes,
                 visible=_BYTES_VISIBLE, hidden=_BYTES_HIDDEN, rules=(Rule(NO_COST_SAYS, no_cost_calls),),
                 solo=True)

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
