"""How close is close enough: tolerances per dtype and backend, and the element masks
the other comparisons build on.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
from typing import Any

import torch
from torch import Tensor


# Why not exact?  A distributed run adds the same numbers in a different
# order than the single-process reference (each rank sums its own micro-batch,
# then the all-reduce adds the partial sums), and float addition is not
# associative.  Measured on gloo/CPU: multi-rank float32 gradients agree with
# the reference to about 1e-8, not bit for bit (docs/accuracy.md).
# So float32 gets rtol 1e-5 / atol 1e-6: 100x above that noise, far below the
# size of a real bug (a factor of N, a missing shard, an un-broadcast init).
# Half precisions get about two units in the last place (fp16 eps ~ 1e-3,
# bf16 eps ~ 8e-3); float64 noise is ~1e-16 so 1e-9 is generous; integers and
# booleans must match exactly.
_TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-9, 1e-12),
    torch.float32: (1e-5, 1e-6),
    torch.float16: (2e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
}


# NCCL on GPUs: kernels pick different reduction orders (split-K matmuls,
# atomics in some backward passes) and the reference often ran on another
# device, so floats get 10x more room there.
_GPU_FACTOR = 10.0


def tolerances(dtype: torch.dtype, backend: str = "gloo") -> tuple[float, float]:
    """Return ``(rtol, atol)`` for comparing a distributed result of ``dtype``
    with a single-process reference (see the comment above for the reasons)."""
    b = backend.lower()
    if "nccl" in b:
        factor = _GPU_FACTOR
    elif b in ("gloo", "mpi"):
        factor = 1.0
    else:
        raise ValueError(f"unknown backend {backend!r}: expected 'gloo', 'nccl' or 'mpi'")
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    if not dtype.is_floating_point:
        return 0.0, 0.0  # integers and bool: exact
    rtol, atol = _TOLERANCES.get(dtype, _TOLERANCES[torch.float32])
    return rtol * factor, atol * factor


#: The backend whose tolerances apply to the comparison in progress.  Set by
#: the ``backend=`` keyword of every public ``assert_*`` (and by
#: ``judged_on``), read by ``default_tols``: answers computed on NCCL are
#: judged with NCCL's room for reduction noise, answers on gloo with gloo's.
_BACKEND: contextvars.ContextVar[str] = contextvars.ContextVar("parlab_check_backend", default="gloo")


@contextlib.contextmanager
def judged_on(backend: str | None):
    """Within the block, default tolerances are those of ``backend`` (None: unchanged)."""
    if backend is None:
        yield
        return
    tolerances(torch.float32, backend)  # refuse an unknown backend here, not deep inside
    token = _BACKEND.set(backend)
    try:
        yield
    finally:
        _BACKEND.reset(token)


def backend_aware(fn):
    """Give a public assertion a ``backend=`` keyword that selects its default tolerances."""
    @functools.wraps(fn)
    def wrapper(*args, backend: str | None = None, **kwargs):
        with judged_on(backend):
            return fn(*args, **kwargs)
    return wrapper


def default_tols(a: torch.dtype, b: torch.dtype, rtol, atol) -> tuple[float, float]:
    """Fill in missing tolerances from the less precise of the two dtypes, for the current backend."""
    backend = _BACKEND.get()
    ra, aa = tolerances(a, backend)
    rb, ab = tolerances(b, backend)
    return (max(ra, rb) if rtol is None else rtol, max(aa, ab) if atol is None else atol)


def close_mask(got: Tensor, expected: Tensor, rtol: float | None = None,
               atol: float | None = None) -> Tensor:
    """Boolean tensor: True where ``got`` is within tolerance of ``expected`` (same shape)."""
    rtol, atol = default_tols(got.dtype, expected.dtype, rtol, atol)
    return ~bad_mask(got, expected, rtol, atol)


def same_values(got: Any, expected: Any) -> bool:
    """True when ``got`` is a tensor of ``expected``'s shape, float-ness and values.

    Never raises: None, a list or a wrong shape simply compare unequal, so a
    hint that calls it cannot crash on a student's odd result.
    """
    return (isinstance(got, Tensor) and isinstance(expected, Tensor)
            and got.shape == expected.shape
            and got.dtype.is_floating_point == expected.dtype.is_floating_point
            and bool(close_mask(got, expected).all()))


def wide(t: Tensor) -> Tensor:
    return t.to(torch.complex128 if t.dtype.is_complex else torch.float64)


def bad_mask(got: Tensor, exp: Tensor, rtol: float, atol: float) -> Tensor:
    """True where ``got`` is not close to ``exp`` (NaN matches only NaN)."""
    if not (got.dtype.is_floating_point or got.dtype.is_complex
            or exp.dtype.is_floating_point or exp.dtype.is_complex):
        return got != exp  # integers and bool: exact, no float round-trip
    g, e = wide(got), wide(exp)
    close = (g - e).abs() <= atol + rtol * e.abs()
    close |= g == e  # equal infinities
    close |= g.isnan() & e.isnan()
    return ~close
