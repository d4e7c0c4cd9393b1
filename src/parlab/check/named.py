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
from .tensors import tensor_mismatch


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
    for name, ref in e.items():
        if what == "gradient" and g[name] is None:
            failures.append((name, f"'{name}' has no gradient (None): was it used in the "
                                   "forward pass, and did backward() run?"))
            continue
        msg = tensor_mismatch(g[name], ref, name, None, rtol, atol, what=what, world_size=world_size)
        if msg:
            failures.append((name, msg))
    if failures:
        names = [n for n, _ in failures]
        raise AssertionError(
            f"{rank_phrase(rank)}{len(failures)} of {len(e)} {what}s do not match the reference "
            f"({names_phrase(names)}). First: {failures[0][1]}")


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

    A gradient that is a constant multiple of the reference is named: N x the
    reference means summed instead of averaged, 1/N means averaged twice.
    Pass ``world_size`` so the hint can say N.
    """
    _match_named(got, expected, rank, "gradient", rtol, atol, world_size)
