"""Comparing one tensor with its reference: the shape and dtype problems first, then the
values, with a hint when the error has a recognisable ratio (a factor of N, a sum
instead of a mean).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .closeness import backend_aware, bad_mask, default_tols, wide
from .phrases import dtype_kind, short_number, shape_hint, rank_phrase


def to_tensor(x: Any, name: str, rank: int | None) -> Tensor:
    """Turn what a student returned into a detached CPU tensor, or explain why not."""
    if x is None:
        raise AssertionError(f"{rank_phrase(rank)}'{name}' is None: did you forget to return it?")
    if hasattr(x, "full_tensor") and hasattr(x, "placements"):
        raise AssertionError(
            f"{rank_phrase(rank)}'{name}' is a DTensor: call .full_tensor() for the whole "
            "tensor (or .to_local() for this rank's shard) before returning it")
    if isinstance(x, Tensor):
        return x.detach().cpu()
    try:
        return torch.as_tensor(x)
    except Exception:
        raise AssertionError(
            f"{rank_phrase(rank)}'{name}' is a {type(x).__name__}, not a tensor") from None


def structure_problem(got: Tensor, exp: Tensor, name: str, rank, ref: str,
                       exact_dtype: bool = False) -> str | None:
    """Shape or dtype differences, which make an element-wise comparison meaningless."""
    if got.shape != exp.shape:
        return (f"{rank_phrase(rank)}'{name}' has shape {tuple(got.shape)} but {ref} has "
                f"{tuple(exp.shape)}{shape_hint(got.shape, exp.shape)}")
    if dtype_kind(got.dtype) != dtype_kind(exp.dtype) or (exact_dtype and got.dtype != exp.dtype):
        return f"{rank_phrase(rank)}'{name}' has dtype {got.dtype} but {ref} has {exp.dtype}"
    return None


def ratio_hint(g: Tensor, e: Tensor, what: str, world_size: int | None) -> str:
    """If ``got`` is a constant multiple of ``expected``, name the constant."""
    if g.dtype.is_complex or not bool(e.abs().max() > 0) or not bool(g.isfinite().all()):
        return ""
    if not bool(g.abs().max() > 0):
        return (f" Every element is zero: was the {what} ever computed (backward run, "
                "result copied back into the tensor you returned)?")
    r = float((g * e).sum() / (e * e).sum())  # least-squares scale factor
    if abs(r - 1) < 1e-3 or not bool(((g - r * e).abs() <= 1e-4 * e.abs() + 1e-9 * e.abs().max()).all()):
        return ""
    k, inv = round(r), round(1 / r) if r else 0
    if world_size and abs(r - world_size) < 1e-3 * world_size:
        return (f" Every element is {world_size}x the reference: looks like the {what}s "
                f"were summed, not averaged (ratio ≈ N = {world_size}); divide by the "
                "world size or use ReduceOp.AVG.")
    if world_size and abs(r * world_size - 1) < 1e-3:
        return (f" Every element is 1/{world_size} of the reference (ratio ≈ 1/N): "
                "was it divided by the world size twice?")
    if k >= 2 and abs(r - k) < 1e-3 * k:
        hint = "summed, not averaged" if what in ("gradient", "result") else "summed or scaled"
        return (f" Every element is {k}x the reference: looks like the {what}s were "
                f"{hint} (ratio ≈ {k}; is {k} the world size?).")
    if inv >= 2 and abs(1 / r - inv) < 1e-3 * inv:
        return (f" Every element is 1/{inv} of the reference (ratio ≈ 1/{inv}): divided "
                f"by {inv} once too often, or only one rank's share?")
    if abs(r + 1) < 1e-3:
        return " Every element has the opposite sign: a flipped sign (loss or update)?"
    if g.numel() < 4:  # too few numbers for an arbitrary constant ratio to mean much
        return ""
    return f" Every element is {r:.4g}x the reference (constant ratio): a scale factor is off."


def _value_message(got: Tensor, exp: Tensor, bad: Tensor, name: str, rank, ref: str,
                   rtol: float, atol: float, what: str, world_size: int | None) -> str:
    n_bad, total = int(bad.sum()), bad.numel()
    if got.dtype.is_floating_point or got.dtype.is_complex or exp.dtype.is_floating_point:
        g, e = wide(got), wide(exp)
        diff = (g - e).abs().nan_to_num(nan=math.inf)
    else:
        g, e = got, exp
        diff = (g.to(torch.float64) - e.to(torch.float64)).abs()
    flat = int(torch.where(bad, diff.to(torch.float64), -1.0).reshape(-1).argmax())  # index into the flat (numel,) view
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), bad.shape)) if bad.dim() else ()
    gv, ev, dv = got.reshape(-1)[flat].item(), exp.reshape(-1)[flat].item(), diff.reshape(-1)[flat].item()  # flat (numel,) views; got, exp, diff share a shape
    tol = "exactly" if rtol == 0 and atol == 0 else f"within rtol={rtol:g}, atol={atol:g}"
    msg = (f"{rank_phrase(rank)}'{name}' does not match {ref}: {n_bad} of {total} elements differ "
           f"({tol}). Largest absolute difference {dv:.3g} "
           f"{f'at index {idx}' if idx else '(a scalar)'}: "
           f"got {short_number(gv)}, expected {short_number(ev)}.")
    nan = got.isnan() & ~exp.isnan() if got.dtype.is_floating_point else None
    if nan is not None and bool(nan.any()):
        first = int(nan.reshape(-1).nonzero()[0])  # flat: the first NaN's row-major index
        nidx = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), nan.shape)) if nan.dim() else ()
        return msg + (f" {int(nan.sum())} element(s) are NaN (first at index {nidx}): look for "
                      "a division by zero, log(0), or an uninitialised buffer (torch.empty).")
    return msg + ("" if got.dtype == torch.bool else ratio_hint(g, e, what, world_size))


def tensor_mismatch(got: Any, expected: Any, name: str, rank: int | None, rtol, atol, *,
              ref: str = "the reference", what: str = "value",
              world_size: int | None = None, exact_dtype: bool = False) -> str | None:
    """Describe how ``got`` differs from ``expected``, or return None if it does not."""
    g = to_tensor(got, name, rank)
    e = to_tensor(expected, f"reference {name}", None)
    problem = structure_problem(g, e, name, rank, ref, exact_dtype)
    if problem:
        return problem
    rtol, atol = default_tols(g.dtype, e.dtype, rtol, atol)
    bad = bad_mask(g, e, rtol, atol)
    if not bool(bad.any()):
        return None
    return _value_message(g, e, bad, name, rank, ref, rtol, atol, what, world_size)


@backend_aware
def assert_close(got: Any, expected: Any, name: str = "tensor", rank: int | None = None,
                 rtol: float | None = None, atol: float | None = None, *,
                 exact_dtype: bool = False) -> None:
    """Assert that one tensor matches the reference element-wise.

    Tolerances default to ``tolerances()`` of the less precise dtype.  Two
    float dtypes (say float64 against float32) are compared by value; a float
    against an integer or bool fails, and ``exact_dtype=True`` also fails on
    any dtype difference.  NaN in ``got`` fails unless the reference has NaN
    at the same place.
    """
    msg = tensor_mismatch(got, expected, name, rank, rtol, atol, exact_dtype=exact_dtype)
    if msg:
        raise AssertionError(msg)
