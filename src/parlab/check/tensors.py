"""Comparing one tensor with its reference: the shape and dtype problems first, then the
values, and, when every element is one constant multiple of the reference, that ratio (and
whether it is the world size N or 1/N).

One tensor is too little evidence to name a cause: 4x the reference fits a sum that was not
averaged, a loss summed over 4 rows, an all-reduce run twice on 2 ranks...  So the messages here
state the ratio and its relation to N, and name no cause.  ``named.assert_grads_match`` knows
more (every gradient of a model, averaged over N ranks) and names one where that evidence
allows it (see its docstring).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .closeness import backend_aware, bad_mask, default_tols, wide
from ..grading.diagnosis import diagnose, ratio_words, scale_fits
from .phrases import dtype_kind, names_phrase, short_number, shape_hint, rank_phrase


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


def constant_ratio(got: Tensor, expected: Tensor) -> float | None:
    """The one factor r (not 1) with ``got`` = r · ``expected`` at every element, or None.

    Each element must fit to 1e-4 of itself plus 1e-6 of the largest (float32 sums in another
    order, as over ranks, differ by about 1e-7 of the largest).  0.0 when every element
    of ``got`` is zero and the reference is not.  None for complex or non-finite values, an
    empty or all-zero reference, or when no single factor fits.
    """
    g, e = wide(got), wide(expected)
    if (g.dtype.is_complex or e.dtype.is_complex or e.numel() == 0 or g.shape != e.shape
            or not bool(g.isfinite().all()) or not bool(e.isfinite().all()) or not bool(e.abs().max() > 0)):
        return None
    if not bool(g.abs().max() > 0):
        return 0.0
    r = float((g * e).sum() / (e * e).sum())  # least-squares scale factor
    if abs(r - 1) < 1e-3 or not bool(((g - r * e).abs() <= 1e-4 * e.abs() + 1e-6 * e.abs().max()).all()):
        return None
    return r


def _whole(x: float) -> bool:
    return x >= 1 and abs(x - round(x)) < 1e-3 * x


def simple_ratio(r: float) -> bool:
    """0, ±k or ±1/k for a whole k: a ratio worth stating even for one or two numbers."""
    return r == 0 or _whole(abs(r)) or _whole(1 / abs(r))


def ratio_phrase(r: float, world_size: int | None = None, ref: str = "the reference",
                 n_is: str = "the world size N") -> str:
    """A constant ratio as a fact: "4x the reference, and 4 is the world size N", "zero, where ...".

    Names no cause: what the ratio means depends on what the check knows (see ``named`` and
    ``collectives``).
    """
    if r == 0:
        return f"zero, where {ref} is not"
    if r < 0:
        words = (f"{ref} with the opposite sign (-1x)" if abs(r + 1) < 1e-3
                 else f"{ratio_words(-r)} {ref} with the opposite sign")
    else:
        words = f"{ratio_words(r)} {ref}"
    n = world_size or 0
    if n > 1 and (abs(r - n) < 1e-3 * n or abs(r * n - 1) < 1e-3):  # N or 1/N
        words += f", and {n} is {n_is}"
    return words


def ratio_note(got: Tensor, exp: Tensor, world_size: int | None = None, ref: str = "the reference") -> str:
    """The sentence a one-tensor message ends with when ``got`` is a constant multiple of ``exp``
    (" Every element is 4x the reference."), or "".  An arbitrary factor is stated only for 4 or
    more elements: for fewer any two numbers have some ratio."""
    r = constant_ratio(got, exp)
    if r is None or (not simple_ratio(r) and got.numel() < 4):
        return ""
    subject = "It is" if got.numel() == 1 else "Every element is"
    return f" {subject} {ratio_phrase(r, world_size, ref)}."


def ratio_of(got: Any, ref: Any) -> float | None:
    """``got``'s constant ratio to ``ref`` as ``ratio_note`` would state it, or None (no ratio, a
    factor too weak to state, or no comparable float tensors)."""
    try:
        g, e = to_tensor(got, "", None), to_tensor(ref, "", None)
    except AssertionError:
        return None
    if g.shape != e.shape or g.dtype == torch.bool or not (g.dtype.is_floating_point or e.dtype.is_floating_point):
        return None
    r = constant_ratio(g, e)
    return None if r is None or (not simple_ratio(r) and g.numel() < 4) else r


def grouped_ratios(ratios: dict) -> list[tuple[float, list]]:
    """``{key: ratio}`` grouped by equal ratio (to 1e-3), in first-seen order: ``[(ratio, keys)]``."""
    groups: list[tuple[float, list]] = []
    for k, r in ratios.items():
        for ratio, keys in groups:
            if abs(r - ratio) <= 1e-3 * abs(ratio):
                keys.append(k)
                break
        else:
            groups.append((r, [k]))
    return groups


def ratios_sentence(ratios: dict[str, float | None], total: int, what: str,
                    world_size: int | None = None) -> str:
    """The constant ratios of the named tensors that differ (``{name: ratio or None}``, ``total``
    compared in all), as facts: one sentence when they all share one ratio, else each ratio with
    its tensors (those with none are counted, not listed)."""
    found = {k: r for k, r in ratios.items() if r is not None}
    if not found:
        return ""
    groups = grouped_ratios(found)
    if len(groups) == 1 and len(found) == len(ratios):
        r = groups[0][0]
        if len(ratios) == total:
            return f" Every {what} is {ratio_phrase(r, world_size)}."
        others = total - len(ratios)
        subject = (f"{names_phrase(list(ratios))} is" if len(ratios) == 1 else
                   f"The {len(ratios)} {what}s that differ are each")
        return (f" {subject} {ratio_phrase(r, world_size)}; "
                + ("the other one matches." if others == 1 else f"the other {others} match."))
    parts = [f"{names_phrase(names, 3)} {'is' if len(names) == 1 else 'are'} {ratio_phrase(r, world_size)}"
             for r, names in groups]
    rest = len(ratios) - len(found)
    return (" " + "; ".join(parts) + "."
            + (f" The other {rest} that differ are no constant multiple of the reference." if rest else ""))


def reduction_mistakes(n: int) -> list[tuple[str, float, str]]:
    """The two reduction mistakes that scale a gradient averaged over ``n`` ranks by one factor,
    as ``(name, gradient / reference, sentence)`` for ``diagnosis.scale_fits``."""
    return [("summed", n, f"the gradients were summed over the {n} ranks, not averaged: divide the "
                          "sum by the world size, or use ReduceOp.AVG."),
            ("twice", 1 / n, "the gradients were divided by the world size twice (ReduceOp.AVG "
                             "already divides).")]


def reduction_cause(ratios: dict[str, float | None], right: int, world_size: int | None) -> str:
    """The reduction mistake every differing gradient's ratio fits, or "": one piece per tensor
    (``ratios``, as for ``ratios_sentence``), and ``right`` tensors that match a nonzero reference
    rule both mistakes out (see ``named.assert_grads_match`` for why this evidence suffices)."""
    if not world_size or world_size < 2:
        return ""
    mistakes = reduction_mistakes(world_size)
    return diagnose([scale_fits(r, mistakes) for r in ratios.values()],
                    [[name for name, _, _ in mistakes]] * right)


def _value_message(got: Tensor, exp: Tensor, bad: Tensor, name: str, rank, ref: str,
                   rtol: float, atol: float, world_size: int | None, ratio: bool) -> str:
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
    return msg + ("" if got.dtype == torch.bool or not ratio else ratio_note(g, e, world_size, ref))


def tensor_mismatch(got: Any, expected: Any, name: str, rank: int | None, rtol, atol, *,
                    ref: str = "the reference", world_size: int | None = None,
                    exact_dtype: bool = False, ratio: bool = True) -> str | None:
    """Describe how ``got`` differs from ``expected``, or return None if it does not.

    ``ratio=False`` leaves out the constant-ratio sentence (a caller comparing many tensors
    states the ratios of all of them at once)."""
    g = to_tensor(got, name, rank)
    e = to_tensor(expected, f"reference {name}", None)
    problem = structure_problem(g, e, name, rank, ref, exact_dtype)
    if problem:
        return problem
    rtol, atol = default_tols(g.dtype, e.dtype, rtol, atol)
    bad = bad_mask(g, e, rtol, atol)
    if not bool(bad.any()):
        return None
    return _value_message(g, e, bad, name, rank, ref, rtol, atol, world_size, ratio)


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
