"""Comparison helpers for the autograder: did the ranks compute the right thing?

Each helper takes what the ranks returned (a list in rank order, as
``parlab.launch`` gives it) or one rank's tensor, and compares it with a
single-process reference.  On failure it raises ``AssertionError`` (nbgrader
then marks the test cell as failed) with a message a student can act on: the
name, the rank, how many elements are off, the largest absolute difference,
the index where it is, the two values there, and a hint when the error has a
recognisable shape (summed instead of averaged, a shard shifted by one row,
ranks that never synchronised).

    check.assert_grads_match(grads_rank0, ref_grads, rank=0, world_size=4)
    check.assert_same_across_ranks(params_per_rank, name="params")
    check.assert_shards_reassemble(shards, full_weight, dim=0)

Tolerances follow the backend the answer ran on: every public assertion
takes ``backend=`` ("gloo", "nccl", "cpu:gloo,cuda:nccl"), and the grading
harness wraps whole gradings in ``judged_on(backend)``.

Why one module of about 700 lines: every assertion is built from the same
private message helpers (``_to_tensor``, ``_structure_problem``,
``_value_message``, ``_ratio_hint``, ``_runs``).  Split into several modules,
those would become a private API shared across files; kept here, the one
place that phrases a comparison stays readable top to bottom, in sections.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "tolerances",
    "judged_on",
    "close_mask",
    "grad_scale",
    "ranks_phrase",
    "same_values",
    "named_differ",
    "assert_close",
    "assert_params_match",
    "assert_grads_match",
    "assert_same_across_ranks",
    "assert_shards_reassemble",
    "assert_collective_result",
]

# --------------------------------------------------------------------------
# Tolerances
# --------------------------------------------------------------------------

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
#: ``judged_on``), read by ``_default_tols``: answers computed on NCCL are
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


def _backend_aware(fn):
    """Give a public assertion a ``backend=`` keyword that selects its default tolerances."""
    @functools.wraps(fn)
    def wrapper(*args, backend: str | None = None, **kwargs):
        with judged_on(backend):
            return fn(*args, **kwargs)
    return wrapper


def _default_tols(a: torch.dtype, b: torch.dtype, rtol, atol) -> tuple[float, float]:
    """Fill in missing tolerances from the less precise of the two dtypes, for the current backend."""
    backend = _BACKEND.get()
    ra, aa = tolerances(a, backend)
    rb, ab = tolerances(b, backend)
    return (max(ra, rb) if rtol is None else rtol, max(aa, ab) if atol is None else atol)


def close_mask(got: Tensor, expected: Tensor, rtol: float | None = None,
               atol: float | None = None) -> Tensor:
    """Boolean tensor: True where ``got`` is within tolerance of ``expected`` (same shape)."""
    rtol, atol = _default_tols(got.dtype, expected.dtype, rtol, atol)
    return ~_bad_mask(got, expected, rtol, atol)


def same_values(got: Any, expected: Any) -> bool:
    """True when ``got`` is a tensor of ``expected``'s shape, float-ness and values.

    Never raises: None, a list or a wrong shape simply compare unequal, so a
    hint that calls it cannot crash on a student's odd result.
    """
    return (isinstance(got, Tensor) and isinstance(expected, Tensor)
            and got.shape == expected.shape
            and got.dtype.is_floating_point == expected.dtype.is_floating_point
            and bool(close_mask(got, expected).all()))


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
    g = torch.cat([got[k].reshape(-1).double() for k in names])
    e = torch.cat([expected[k].reshape(-1).double() for k in names])
    norm = float(e @ e)
    if norm == 0.0:
        return None
    r = float(g @ e) / norm
    if not bool((g - r * e).abs().max() <= 1e-4 * e.abs().max()):
        return None
    return r


# --------------------------------------------------------------------------
# Small formatting helpers
# --------------------------------------------------------------------------

def _who(rank: int | None) -> str:
    return "" if rank is None else f"rank {rank}: "


def ranks_phrase(ranks: Sequence[int]) -> str:
    """[1] -> 'rank 1', [1, 3] -> 'ranks 1 and 3', [1, 2, 3] -> 'ranks 1, 2 and 3'."""
    r = [str(x) for x in ranks]
    if len(r) == 1:
        return f"rank {r[0]}"
    return f"ranks {', '.join(r[:-1])} and {r[-1]}"


def _names_phrase(names: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _runs(flat: Sequence[int], limit: int = 6) -> str:
    """Compress sorted indices into ranges: [5, 6, 7, 12] -> '5..7, 12'."""
    runs: list[list[int]] = []
    for i in flat:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs[:limit])
    return text + (f", ... ({len(runs)} ranges in all)" if len(runs) > limit else "")


def _num(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


# --------------------------------------------------------------------------
# Comparing two tensors
# --------------------------------------------------------------------------

def _to_tensor(x: Any, name: str, rank: int | None) -> Tensor:
    """Turn what a student returned into a detached CPU tensor, or explain why not."""
    if x is None:
        raise AssertionError(f"{_who(rank)}'{name}' is None: did you forget to return it?")
    if hasattr(x, "full_tensor") and hasattr(x, "placements"):
        raise AssertionError(
            f"{_who(rank)}'{name}' is a DTensor: call .full_tensor() for the whole "
            "tensor (or .to_local() for this rank's shard) before returning it")
    if isinstance(x, Tensor):
        return x.detach().cpu()
    try:
        return torch.as_tensor(x)
    except Exception:
        raise AssertionError(
            f"{_who(rank)}'{name}' is a {type(x).__name__}, not a tensor") from None


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "integer"


def _shape_hint(got: torch.Size, exp: torch.Size) -> str:
    """Guess what went wrong when the shapes differ."""
    if len(got) == len(exp):
        diff = [d for d in range(len(exp)) if got[d] != exp[d]]
        if len(diff) == 1:
            d = diff[0]
            if got[d] and exp[d] % got[d] == 0:
                return (f": dim {d} is 1/{exp[d] // got[d]} of the reference; did you "
                        "return only your shard (all-gather it first)?")
            if exp[d] and got[d] % exp[d] == 0:
                return (f": dim {d} is {got[d] // exp[d]}x the reference; did you "
                        "concatenate full tensors instead of shards?")
        if sorted(got) == sorted(exp):
            return ": same sizes in a different order; a missing transpose or permute?"
    if got.numel() == exp.numel():
        return ": same number of elements; a missing reshape or view?"
    return ""


def _structure_problem(got: Tensor, exp: Tensor, name: str, rank, ref: str,
                       exact_dtype: bool = False) -> str | None:
    """Shape or dtype differences, which make an element-wise comparison meaningless."""
    if got.shape != exp.shape:
        return (f"{_who(rank)}'{name}' has shape {tuple(got.shape)} but {ref} has "
                f"{tuple(exp.shape)}{_shape_hint(got.shape, exp.shape)}")
    if _kind(got.dtype) != _kind(exp.dtype) or (exact_dtype and got.dtype != exp.dtype):
        return f"{_who(rank)}'{name}' has dtype {got.dtype} but {ref} has {exp.dtype}"
    return None


def _wide(t: Tensor) -> Tensor:
    return t.to(torch.complex128 if t.dtype.is_complex else torch.float64)


def _bad_mask(got: Tensor, exp: Tensor, rtol: float, atol: float) -> Tensor:
    """True where ``got`` is not close to ``exp`` (NaN matches only NaN)."""
    if not (got.dtype.is_floating_point or got.dtype.is_complex
            or exp.dtype.is_floating_point or exp.dtype.is_complex):
        return got != exp  # integers and bool: exact, no float round-trip
    g, e = _wide(got), _wide(exp)
    close = (g - e).abs() <= atol + rtol * e.abs()
    close |= g == e  # equal infinities
    close |= g.isnan() & e.isnan()
    return ~close


def _ratio_hint(g: Tensor, e: Tensor, what: str, world_size: int | None) -> str:
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
        g, e = _wide(got), _wide(exp)
        diff = (g - e).abs().nan_to_num(nan=math.inf)
    else:
        g, e = got, exp
        diff = (g.to(torch.float64) - e.to(torch.float64)).abs()
    flat = int(torch.where(bad, diff.to(torch.float64), -1.0).reshape(-1).argmax())
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), bad.shape)) if bad.dim() else ()
    gv, ev, dv = got.reshape(-1)[flat].item(), exp.reshape(-1)[flat].item(), diff.reshape(-1)[flat].item()
    tol = "exactly" if rtol == 0 and atol == 0 else f"within rtol={rtol:g}, atol={atol:g}"
    msg = (f"{_who(rank)}'{name}' does not match {ref}: {n_bad} of {total} elements differ "
           f"({tol}). Largest absolute difference {dv:.3g} "
           f"{f'at index {idx}' if idx else '(a scalar)'}: "
           f"got {_num(gv)}, expected {_num(ev)}.")
    nan = got.isnan() & ~exp.isnan() if got.dtype.is_floating_point else None
    if nan is not None and bool(nan.any()):
        first = int(nan.reshape(-1).nonzero()[0])
        nidx = tuple(int(i) for i in torch.unravel_index(torch.tensor(first), nan.shape)) if nan.dim() else ()
        return msg + (f" {int(nan.sum())} element(s) are NaN (first at index {nidx}): look for "
                      "a division by zero, log(0), or an uninitialised buffer (torch.empty).")
    return msg + ("" if got.dtype == torch.bool else _ratio_hint(g, e, what, world_size))


def _mismatch(got: Any, expected: Any, name: str, rank: int | None, rtol, atol, *,
              ref: str = "the reference", what: str = "value",
              world_size: int | None = None, exact_dtype: bool = False) -> str | None:
    """Describe how ``got`` differs from ``expected``, or return None if it does not."""
    g = _to_tensor(got, name, rank)
    e = _to_tensor(expected, f"reference {name}", None)
    problem = _structure_problem(g, e, name, rank, ref, exact_dtype)
    if problem:
        return problem
    rtol, atol = _default_tols(g.dtype, e.dtype, rtol, atol)
    bad = _bad_mask(g, e, rtol, atol)
    if not bool(bad.any()):
        return None
    return _value_message(g, e, bad, name, rank, ref, rtol, atol, what, world_size)


@_backend_aware
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
    msg = _mismatch(got, expected, name, rank, rtol, atol, exact_dtype=exact_dtype)
    if msg:
        raise AssertionError(msg)


# --------------------------------------------------------------------------
# Named tensors: parameters and gradients
# --------------------------------------------------------------------------

_WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def _named(obj: Any, what: str, rank: int | None) -> dict[str, Any]:
    if isinstance(obj, nn.Module):
        if what == "gradient":
            return {n: p.grad for n, p in obj.named_parameters()}
        return dict(obj.named_parameters())
    if isinstance(obj, Mapping):
        return dict(obj)
    raise AssertionError(f"{_who(rank)}expected a dict of name -> tensor or an nn.Module "
                         f"for the {what}s, got a {type(obj).__name__}")


def _names_problem(got: dict, exp: dict, rank, what: str) -> str | None:
    missing = [k for k in exp if k not in got]
    extra = [k for k in got if k not in exp]
    if not missing and not extra:
        return None
    parts = [f"{_who(rank)}the {what} names do not match the reference."]
    if missing:
        parts.append(f"Missing: {_names_phrase(missing)}.")
    if extra:
        parts.append(f"Unexpected: {_names_phrase(extra)}.")
    for p in _WRAPPER_PREFIXES:
        if extra and all(k.startswith(p) for k in extra) and \
                {k[len(p):] for k in got} >= set(missing):
            parts.append(f"Your names start with {p!r} (a wrapper such as DDP or "
                         "torch.compile): pass the inner module or strip the prefix.")
            break
    return " ".join(parts)


def _match_named(got: Any, expected: Any, rank, what: str, rtol, atol,
                 world_size: int | None = None) -> None:
    g, e = _named(got, what, rank), _named(expected, what, None)
    problem = _names_problem(g, e, rank, what)
    if problem:
        raise AssertionError(problem)
    failures: list[tuple[str, str]] = []
    for name, ref in e.items():
        if what == "gradient" and g[name] is None:
            failures.append((name, f"'{name}' has no gradient (None): was it used in the "
                                   "forward pass, and did backward() run?"))
            continue
        msg = _mismatch(g[name], ref, name, None, rtol, atol, what=what, world_size=world_size)
        if msg:
            failures.append((name, msg))
    if failures:
        names = [n for n, _ in failures]
        raise AssertionError(
            f"{_who(rank)}{len(failures)} of {len(e)} {what}s do not match the reference "
            f"({_names_phrase(names)}). First: {failures[0][1]}")


@_backend_aware
def assert_params_match(got: Mapping[str, Tensor] | nn.Module, expected: Mapping[str, Tensor] | nn.Module,
                        rank: int | None = None, what: str = "parameter",
                        rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that every named tensor in ``got`` matches ``expected`` (same names).

    Reports missing and unexpected names, then how many tensors differ and the
    details of the first one in the reference's order.
    """
    _match_named(got, expected, rank, what, rtol, atol)


@_backend_aware
def assert_grads_match(got: Mapping[str, Tensor] | nn.Module, expected: Mapping[str, Tensor] | nn.Module,
                       rank: int | None = None, world_size: int | None = None,
                       rtol: float | None = None, atol: float | None = None) -> None:
    """Like ``assert_params_match`` for gradients (a module's ``.grad`` fields).

    A gradient that is a constant multiple of the reference is named: N x the
    reference means summed instead of averaged, 1/N means averaged twice.
    Pass ``world_size`` so the hint can say N.
    """
    _match_named(got, expected, rank, "gradient", rtol, atol, world_size)


# --------------------------------------------------------------------------
# Across ranks
# --------------------------------------------------------------------------

_SYNC_HINT = ("did every rank start from rank 0's parameters (broadcast), and did every "
              "rank apply the same averaged gradients?")


@_backend_aware
def assert_same_across_ranks(per_rank: Sequence[Any], name: str = "tensor",
                             rtol: float | None = None, atol: float | None = None, *,
                             exact: bool = False, hint: str = _SYNC_HINT) -> None:
    """Assert that every rank returned the same tensor (or dict of tensors) as rank 0.

    Compared to float tolerance by default, not bit for bit: synchronised ranks
    usually agree exactly, but some correct schemes (FSDP's reduce-scatter then
    all-gather, say) only agree to rounding, while a missing broadcast differs
    by the size of the initial weights, far above any tolerance.  Pass
    ``exact=True`` to demand bitwise equality.
    """
    if len(per_rank) == 0:
        raise ValueError("per_rank is empty: pass one result per rank, in rank order")
    if exact:
        rtol = atol = 0.0
    for r, x in enumerate(per_rank):
        if x is None:
            raise AssertionError(f"rank {r}: '{name}' is None: did every rank return it?")
    first = per_rank[0]
    named = isinstance(first, (Mapping, nn.Module))
    base = _named(first, "tensor", 0) if named else None
    details: dict[int, str] = {}
    for r in range(1, len(per_rank)):
        msg = (_named_differ(per_rank[r], base, r, name, rtol, atol) if named
               else _mismatch(per_rank[r], first, name, r, rtol, atol, ref="rank 0's value"))
        if msg:
            details[r] = msg
    if details:
        bad = sorted(details)
        verb = "differs" if len(bad) == 1 else "differ"
        raise AssertionError(f"{ranks_phrase(bad)} {verb} from rank 0 in '{name}': {hint}\n"
                             f"First difference: {details[bad[0]]}")


def _named_differ(obj: Any, base: dict, r: int, name: str, rtol, atol) -> str | None:
    """First difference between rank r's named tensors and rank 0's, if any."""
    other = _named(obj, "tensor", r)
    problem = _names_problem(other, base, r, "tensor")
    if problem:
        return problem.replace("the reference", "rank 0's")
    for key, ref in base.items():
        msg = _mismatch(other[key], ref, f"{name}.{key}", r, rtol, atol, ref="rank 0's value")
        if msg:
            return msg
    return None


def _along(dim: int) -> str:
    return "rows" if dim == 0 else f"indices along dim {dim}"


def _split_sizes(length: int, n: int) -> list[int]:
    """Shard sizes of ``torch.tensor_split(x, n)``: the first length % n get one more."""
    q, m = divmod(length, n)
    return [q + (r < m) for r in range(n)]


def _offsets(sizes: Sequence[int]) -> list[int]:
    return [sum(sizes[:r]) for r in range(len(sizes))]


@_backend_aware
def assert_shards_reassemble(shards: Sequence[Tensor], full: Tensor, dim: int = 0,
                             name: str = "tensor", *, padded: bool = False, balanced: bool = True,
                             world_size: int | None = None,
                             rtol: float | None = None, atol: float | None = None) -> None:
    """Assert that rank r's shard is the r-th piece of ``full`` along ``dim``.

    Two layouts are accepted:

    * ``padded=False`` (default): ``torch.tensor_split`` style.  Shard sizes
      differ by at most one, the first ``len % n`` shards get the extra row,
      and concatenating the shards gives ``full``.  ``balanced=False`` accepts
      any sizes whose concatenation gives ``full`` (``torch.chunk`` style).
    * ``padded=True``: FSDP/ZeRO style.  Every shard has ``ceil(len / n)``
      rows; the last shard(s) end in zeros that pad the total to
      ``n * ceil(len / n)``.
    """
    n = len(shards)
    if world_size is not None and n != world_size:
        raise AssertionError(f"got {n} shards of '{name}' but the world size is {world_size}: "
                             "did every rank return its shard?")
    if n == 0:
        raise ValueError("shards is empty: pass one shard per rank, in rank order")
    parts = [_to_tensor(s, f"{name} shard", r) for r, s in enumerate(shards)]
    full = _to_tensor(full, f"reference {name}", None)
    if not -full.dim() <= dim < full.dim():
        raise ValueError(f"dim={dim} is out of range for a {full.dim()}-d tensor")
    dim %= full.dim()
    length, unit = full.shape[dim], _along(dim)
    for r, p in enumerate(parts):
        if p.dim() != full.dim() or any(p.shape[d] != full.shape[d] for d in range(full.dim()) if d != dim):
            raise AssertionError(
                f"rank {r}: the shard of '{name}' has shape {tuple(p.shape)} but should have "
                f"the full shape {tuple(full.shape)} except along dim {dim}: sharded along "
                "another dim?")
    sizes = [p.shape[dim] for p in parts]
    if padded:
        c = -(-length // n)
        wrong = [r for r in range(n) if sizes[r] != c]
        if wrong:
            raise AssertionError(
                f"padded shards of '{name}' must all have ceil({length}/{n}) = {c} {unit}; "
                f"{ranks_phrase(wrong)} {'has' if len(wrong) == 1 else 'have'} "
                f"{', '.join(str(sizes[r]) for r in wrong)}")
        offsets = [r * c for r in range(n)]
        real = [max(0, min(c, length - r * c)) for r in range(n)]
    else:
        want = _split_sizes(length, n)
        if sum(sizes) != length or (balanced and sizes != want):
            raise AssertionError(_size_message(parts, full, dim, sizes, want, name, unit, rtol, atol))
        offsets, real = _offsets(sizes), sizes
    failures = []
    for r, p in enumerate(parts):
        msg = _shard_message(p, full, r, dim, offsets[r], real[r], name, unit, rtol, atol)
        if msg is None and real[r] < p.shape[dim] and bool(p.narrow(dim, real[r], p.shape[dim] - real[r]).ne(0).any()):
            msg = (f"rank {r}: the padding of '{name}' ({unit} {real[r]}..{p.shape[dim] - 1} of "
                   "its shard) should be zeros")
        if msg:
            failures.append((r, msg))
    if failures:
        raise AssertionError(f"shards of '{name}' do not reassemble into the full tensor on "
                             f"{ranks_phrase([r for r, _ in failures])}. First: {failures[0][1]}")


def _locate(part: Tensor, full: Tensor, dim: int, rtol, atol) -> int | None:
    """Offset along ``dim`` at which ``part`` appears in ``full``, if anywhere."""
    rows = part.shape[dim]
    if rows == 0 or rows > full.shape[dim]:
        return None
    rt, at = _default_tols(part.dtype, full.dtype, rtol, atol)
    for o in range(full.shape[dim] - rows + 1):
        if not bool(_bad_mask(part, full.narrow(dim, o, rows), rt, at).any()):
            return o
    return None


def _size_message(parts, full, dim, sizes, want, name, unit, rtol, atol) -> str:
    length, n = full.shape[dim], len(parts)
    head = f"shard sizes of '{name}' are {sizes} but splitting {length} {unit} over {n} ranks gives {want}"
    if sum(sizes) != length:
        head += f" (they add up to {sum(sizes)}, not {length})"
        if len(set(sizes)) == 1 and sizes[0] and length % sizes[0] == 0 and length // sizes[0] != n:
            return head + f": looks like a split into {length // sizes[0]} pieces instead of {n}"
        if all(s == -(-length // n) for s in sizes):
            return head + ": every shard has ceil(len/n) rows; if that padding is intended pass padded=True"
    elif torch.equal(torch.cat(parts, dim), full):
        head += (" (they do reassemble, torch.chunk style; pass balanced=False to accept "
                 "unbalanced shards)")
    want_off = _offsets(want)
    for r in range(n):
        found = _locate(parts[r], full, dim, rtol, atol)
        if (found, sizes[r]) != (want_off[r], want[r]):
            held = (f"holds {unit} {found}..{found + sizes[r] - 1}" if found is not None
                    else f"has {sizes[r]} {unit}")
            return (head + f". Rank {r}'s shard {held}; expected {unit} "
                    f"{want_off[r]}..{want_off[r] + want[r] - 1} (torch.tensor_split: the "
                    "first len % n ranks get one extra)")
    return head


def _shard_message(part, full, r, dim, offset, rows, name, unit, rtol, atol) -> str | None:
    got = part.narrow(dim, 0, rows)
    ref = f"{unit} {offset}..{offset + rows - 1} of the full tensor"
    msg = _mismatch(got, full.narrow(dim, offset, rows), f"{name} shard", r, rtol, atol, ref=ref)
    found = _locate(got, full, dim, rtol, atol) if msg else None
    if found is None:  # wrong values, not just the right data at the wrong place
        return msg
    return (f"rank {r}: the shard of '{name}' holds {unit} {found}..{found + rows - 1} of the "
            f"full tensor but should hold {offset}..{offset + rows - 1}: is its start "
            f"offset off by {found - offset}?")


# --------------------------------------------------------------------------
# Collectives (lab 01)
# --------------------------------------------------------------------------

@_backend_aware
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
    g = _to_tensor(got, label, r)
    e = _to_tensor(exp, f"expected {label}", None)
    problem = _structure_problem(g, e, label, r, f"the expected {op_name} result")
    if problem:
        return problem, ""
    rt, at = _default_tols(g.dtype, e.dtype, rtol, atol)
    bad = _bad_mask(g, e, rt, at)
    if not bool(bad.any()):
        return None
    flat = bad.reshape(-1).nonzero().reshape(-1).tolist()
    where = "elements" if g.dim() <= 1 else f"flat elements (shape {tuple(g.shape)})"
    i = flat[0]
    msg = (f"rank {r}'s {label} differs from {op_name} at {where} {_runs(flat)} "
           f"({len(flat)} of {bad.numel()}); at element {i}: got "
           f"{_num(g.reshape(-1)[i].item())}, expected {_num(e.reshape(-1)[i].item())}.")
    if g.dtype.is_floating_point and bool(g.isnan().any()):
        return msg + " The result contains NaN.", ""
    if g.dtype.is_floating_point or e.dtype.is_floating_point:
        hint = _ratio_hint(_wide(g), _wide(e), "result", n).strip()
        return msg, "\n" + hint if hint else ""
    return msg, ""
