"""Lab 01: what every rank holds after a collective, against what the collective is
defined to leave there.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor

from .closeness import backend_aware, bad_mask, default_tols, wide
from .phrases import short_number, index_runs, ranks_phrase
from .tensors import ratio_hint, structure_problem, to_tensor


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
    failures: dict[int, str] = {}
    for r, (got, exp) in enumerate(zip(per_rank_results, expected_per_rank)):
        pairs = [("result", got, exp)]
        if isinstance(exp, (list, tuple)):
            if not isinstance(got, (list, tuple)) or len(got) != len(exp):
                size = len(got) if isinstance(got, (list, tuple)) else type(got).__name__
                failures[r] = (f"rank {r}'s result should be a list of {len(exp)} tensors, got {size}", "")
                continue
            pairs = [(f"result[{i}]", g, e) for i, (g, e) in enumerate(zip(got, exp))]
        for label, g, e in pairs:
            msg = _collective_message(g, e, r, label, op_name, rtol, atol, n)
            if msg:
                failures[r] = msg
                break
    if failures:
        bad = sorted(failures)
        hint = failures[bad[0]][1]
        raise AssertionError(f"{op_name} gave wrong results on {ranks_phrase(bad)}:\n  "
                             + "\n  ".join(failures[r][0] for r in bad) + hint)


def _collective_message(got, exp, r, label, op_name, rtol, atol, n) -> tuple[str, str] | None:
    """(what differs on rank r, a hint about why) or None if the result is right."""
    g = to_tensor(got, label, r)
    e = to_tensor(exp, f"expected {label}", None)
    problem = structure_problem(g, e, label, r, f"the expected {op_name} result")
    if problem:
        return problem, ""
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
        return msg + " The result contains NaN.", ""
    if g.dtype.is_floating_point or e.dtype.is_floating_point:
        hint = ratio_hint(wide(g), wide(e), "result", n).strip()
        return msg, "\n" + hint if hint else ""
    return msg, ""
