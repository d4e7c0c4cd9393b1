"""Lab 01: what every rank holds after a collective, against what the collective is
defined to leave there.

When a rank's result is one constant multiple of the expected one, the message states the
ratio, on which ranks, and whether it is the number of ranks N or 1/N; it names no cause.  The
check knows the expected result, not how the answer was meant to reach it: N times an
all-reduce's sum fits a result reduced twice, a SUM where the op averages, a rank that added
its input N times, and the check cannot tell these apart.  The lab's own grader, which knows
each case's inputs, says more where its evidence allows.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from .closeness import backend_aware, bad_mask, default_tols
from .phrases import short_number, index_runs, ranks_phrase
from .tensors import grouped_ratios, ratio_of, ratio_phrase, structure_problem, to_tensor


@backend_aware
def assert_collective_result(per_rank_results: Sequence[Any], expected_per_rank: Sequence[Any] | Tensor,
                             op_name: str = "the collective",
                             rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that each rank's result of a collective matches the expected one.

    ``expected_per_rank`` is a list in rank order, or one tensor that every
    rank should hold (all_reduce, all_gather).  A result may be a tensor or a
    list of tensors (the output list of ``all_gather``).  Mismatching elements
    are reported as flat index ranges, e.g. "elements 5..7".
    """
    n = len(per_rank_results)
    if isinstance(expected_per_rank, Tensor):
        expected_per_rank = [expected_per_rank] * n
    if n != len(expected_per_rank):
        raise AssertionError(f"got results from {n} ranks but expected {len(expected_per_rank)}: "
                             "did every rank return its result?")
    failures: dict[int, tuple[str, float | None]] = {}  # rank: (what differs, constant ratio or None)
    for r, (got, exp) in enumerate(zip(per_rank_results, expected_per_rank)):
        pairs = [("result", got, exp)]
        if isinstance(exp, (list, tuple)):
            if not isinstance(got, (list, tuple)) or len(got) != len(exp):
                size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
                failures[r] = (f"rank {r}'s result should be a list of {len(exp)} tensors, got {size}", None)
                continue
            pairs = [(f"result[{i}]", g, e) for i, (g, e) in enumerate(zip(got, exp))]
        for label, g, e in pairs:
            msg = _collective_message(g, e, r, label, op_name, rtol, atol, n)
            if msg:  # a ratio is stated for a one-tensor result only: of a list, one piece was compared
                failures[r] = msg if len(pairs) == 1 else (msg[0], None)
                break
    if failures:
        bad = sorted(failures)
        raise AssertionError(f"{op_name} gave wrong results on {ranks_phrase(bad)}:\n  "
                             + "\n  ".join(failures[r][0] for r in bad)
                             + _ratios({r: failures[r][1] for r in bad}, n))


def _ratios(ratios: dict[int, float | None], n: int) -> str:
    """The ranks whose result is a constant multiple of the expected one, and the ratio: a fact,
    no cause (see the module docstring)."""
    found = {r: x for r, x in ratios.items() if x is not None}
    if not found:
        return ""
    return "\n" + " ".join(
        f"On {'every rank' if len(ranks) == n > 1 else ranks_phrase(ranks)} the result is "
        f"{ratio_phrase(x, n, 'the expected one', 'the number of ranks N')}."
        for x, ranks in grouped_ratios(found))


def _collective_message(got, exp, r, label, op_name, rtol, atol, n) -> tuple[str, float | None] | None:
    """(what differs on rank r, its constant ratio to the expected result or None), or None if
    the result is right."""
    g = to_tensor(got, label, r)
    e = to_tensor(exp, f"expected {label}", None)
    problem = structure_problem(g, e, label, r, f"the expected {op_name} result")
    if problem:
        return problem, None
    rt, at = default_tols(g.dtype, e.dtype, rtol, atol)
    bad = bad_mask(g, e, rt, at)
    if not bool(bad.any()):
        return None
    flat = bad.reshape(-1).nonzero().reshape(-1).tolist()  # flat: the differing elements' row-major indices
    where = "elements" if g.dim() <= 1 else f"flat elements (shape {tuple(g.shape)})"
    i = flat[0]
    msg = (f"rank {r}'s {label} differs from {op_name} at {where} {index_runs(flat)} "
           f"({len(flat)} of {bad.numel()}); at element {i}: got "
           f"{short_number(g.reshape(-1)[i].item())}, expected {short_number(e.reshape(-1)[i].item())}.")  # flat (numel,) views
    if g.dtype.is_floating_point and bool(g.isnan().any()):
        return msg + " The result contains NaN.", None
    return msg, ratio_of(g, e)
