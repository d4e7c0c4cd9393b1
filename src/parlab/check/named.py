"""Comparing named tensors (parameters, gradients): the same names first, then each
tensor, with the wrapper prefixes of DDP, FSDP and torch.compile ignored.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from .closeness import backend_aware, same_values
from .phrases import names_phrase, rank_phrase
from ..grading.diagnosis import hint
from .tensors import ratio_of, ratios_sentence, reduction_cause, tensor_mismatch


def named_differ(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """True when some name in both mappings holds different values (None vs tensor differs)."""
    return any(not same_values(a[k], b[k]) for k in b if k in a and b[k] is not None)


def grad_scale(got: Mapping[str, Any], expected: Mapping[str, Any]) -> float | None:
    """The one factor r with got ≈ r·expected over every gradient both hold, or None.

    Recognises "summed instead of averaged" (r = world size) and friends.
    Entries that are None or not tensors of the expected shape are ignored;
    returns None when nothing is left or no single factor fits.
    """
    names = [k for k, e in expected.items() if isinstance(e, Tensor) and
             isinstance(got.get(k), Tensor) and got[k].shape == e.shape]
    if not names:
        return None
    g = torch.cat([got[k].reshape(-1).double() for k in names])  # (Σ numel,): the gradients flat, end to end
    e = torch.cat([expected[k].reshape(-1).double() for k in names])  # (Σ numel,), the same order as g
    norm = float(e @ e)
    if norm == 0.0:
        return None
    r = float(g @ e) / norm
    if not bool((g - r * e).abs().max() <= 1e-4 * e.abs().max()):
        return None
    return r


_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def as_named(obj: Any, what: str, rank: int | None) -> dict[str, Any]:
    if isinstance(obj, nn.Module):
        if what == "gradient":
            return {n: p.grad for n, p in obj.named_parameters()}
        return dict(obj.named_parameters())
    if isinstance(obj, Mapping):
        return dict(obj)
    raise AssertionError(f"{rank_phrase(rank)}expected a dict of name -> tensor or an nn.Module "
                         f"for the {what}s, got a {type(obj).__name__}")


def names_problem(got: dict, exp: dict, rank, what: str) -> str | None:
    missing = [k for k in exp if k not in got]
    extra = [k for k in got if k not in exp]
    if not missing and not extra:
        return None
    parts = [f"{rank_phrase(rank)}the {what} names do not match the reference."]
    if missing:
        parts.append(f"Missing: {names_phrase(missing)}.")
    if extra:
        parts.append(f"Unexpected: {names_phrase(extra)}.")
    for p in _WRAPPER_PREFIXES:
        if extra and all(k.startswith(p) for k in extra) and \
                {k[len(p):] for k in got} >= set(missing):
            parts.append(f"Your names start with {p!r} (a wrapper such as DDP or "
                         "torch.compile): pass the inner module or strip the prefix.")
            break
    return " ".join(parts)


def _match_named(got: Any, expected: Any, rank, what: str, rtol, atol,
                 world_size: int | None = None) -> None:
    g, e = as_named(got, what, rank), as_named(expected, what, None)
    problem = names_problem(g, e, rank, what)
    if problem:
        raise AssertionError(problem)
    failures: list[tuple[str, str]] = []
    ratios: dict[str, float | None] = {}  # each differing tensor's constant ratio to its reference
    right = 0                             # tensors that match a nonzero reference
    for name, ref in e.items():
        if what == "gradient" and g[name] is None:
            failures.append((name, f"'{name}' has no gradient (None): was it used in the "
                                   "forward pass, and did backward() run?"))
            ratios[name] = None
            continue
        msg = tensor_mismatch(g[name], ref, name, None, rtol, atol, world_size=world_size, ratio=False)
        if msg:
            failures.append((name, msg))
            ratios[name] = ratio_of(g[name], ref)
        else:
            right += isinstance(ref, Tensor) and bool((ref != 0).any())
    if failures:
        names = [n for n, _ in failures]
        cause = reduction_cause(ratios, right, world_size) if what == "gradient" else ""
        raise AssertionError(
            f"{rank_phrase(rank)}{len(failures)} of {len(e)} {what}s do not match the reference "
            f"({names_phrase(names)}). First: {failures[0][1]}"
            + ratios_sentence(ratios, len(e), what, world_size) + hint(cause))


@backend_aware
def assert_params_match(got: Mapping[str, Tensor] | nn.Module, expected: Mapping[str, Tensor] | nn.Module,
                        rank: int | None = None, what: str = "parameter",
                        rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that every named tensor in ``got`` matches ``expected`` (same names).

    Reports missing and unexpected names, then how many tensors differ and the
    details of the first one in the reference's order.
    """
    _match_named(got, expected, rank, what, rtol, atol)


@backend_aware
def assert_grads_match(got: Mapping[str, Tensor] | nn.Module, expected: Mapping[str, Tensor] | nn.Module,
                       rank: int | None = None, world_size: int | None = None,
                       rtol: float | None = None, atol: float | None = None) -> None:
    """Like ``assert_params_match`` for gradients (a module's ``.grad`` fields).

    The ratio of each differing gradient to the reference is stated when it is
    one constant, with its relation to ``world_size`` N.  A cause is named only
    with ``world_size``, which states this check's contract: ``got`` is the
    average over N ranks of each rank's gradient of the caller's loss, and
    ``expected`` the gradient of that loss on the whole batch.  The loss and
    the batch being the reference's, a factor common to every gradient comes
    from the reduction: N when the sum was not divided, 1/N when it was divided
    a second time.  So "summed" ("divided twice") is named only when every
    gradient that differs is N (1/N) times the reference and none matches a
    nonzero reference (``diagnosis.diagnose``, one piece per tensor); a ratio
    on some tensors only, or any other factor, is stated with no cause.
    """
    _match_named(got, expected, rank, "gradient", rtol, atol, world_size)
