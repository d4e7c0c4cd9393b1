"""What a student's object keeps alive: the tensor storages reachable from it.

A check that reads only ``p.grad`` cannot see a full-size gradient buffer
kept as an attribute (``self.flat_grad``), or a list of the full gradients
kept after they were taken off the parameters.  ``kept_storages(obj)``
walks the object's attributes (lists, tuples, dicts and plain objects
inside them, a few levels deep; not into ``nn.Module``s, whose parameters
the checks measure themselves) and returns every distinct tensor storage it
reaches, with the gradients of the tensors it finds.  ``extra_bytes`` then
counts the bytes of those that are neither the model's parameters, nor the
optimizer's parameters and state, nor a buffer that holds the current
parameters (a flat copy that the all-gather fills): what is left is
gradient storage and scratch buffers.
"""
from __future__ import annotations

import types

import torch
from torch import nn

_DEPTH = 5
#: Not walked into: modules (the checks measure their parameters), optimizers (their state is
#: counted apart), and code.
_OPAQUE = (nn.Module, torch.optim.Optimizer, type, types.FunctionType, types.MethodType,
           types.BuiltinFunctionType, types.ModuleType, str, bytes)


def _storage_key(t: torch.Tensor):
    st = t.untyped_storage()
    return (str(t.device), st.data_ptr()) if st.data_ptr() else ("empty", id(st))


def kept_tensors(obj) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj``'s attributes (and their ``.grad``), once each."""
    seen: set[int] = set()
    found: list[torch.Tensor] = []

    def walk(value, depth: int) -> None:
        if id(value) in seen or depth > _DEPTH:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found.append(value)
            if value.grad is not None and id(value.grad) not in seen:
                seen.add(id(value.grad))
                found.append(value.grad)
            return
        if isinstance(value, _OPAQUE):
            return
        if isinstance(value, dict):
            for v in value.values():
                walk(v, depth + 1)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for v in value:
                walk(v, depth + 1)
        elif hasattr(value, "__dict__"):
            try:
                attrs = list(vars(value).values())
            except TypeError:  # an extension object without a real __dict__
                return
            for v in attrs:
                walk(v, depth + 1)

    walk(obj, 0)
    return found


def _holds_parameters(t: torch.Tensor, flats: list[torch.Tensor]) -> bool:
    """Whether ``t`` holds the current parameters (flat, padded or not, or one tensor of them)."""
    flat = t.detach().reshape(-1)
    for want in flats:
        if flat.numel() >= want.numel() > 0 and flat.dtype == want.dtype and bool(
                torch.equal(flat[:want.numel()].cpu(), want)):
            return True
    return False


def extra_bytes(obj, model_params: list[torch.Tensor], optimizers: list) -> dict:
    """Bytes of the storages ``obj`` keeps besides parameters and optimizer state (plain data).

    Returns ``{"bytes": total, "largest": elements of the largest such tensor}``.
    """
    own = {_storage_key(p) for p in model_params}
    flats = []
    live = [p.detach().reshape(-1).cpu() for p in model_params if p.untyped_storage().nbytes()]
    if live:
        flats = [torch.cat(live)] + [torch.cat([p.detach().reshape(-1).cpu() for p in model_params
                                                if p.requires_grad and p.untyped_storage().nbytes()]
                                               or [torch.zeros(0)])] + live
    for opt in optimizers:
        for group in opt.param_groups:
            own.update(_storage_key(p) for p in group["params"])
        for state in opt.state.values():
            own.update(_storage_key(v) for v in state.values() if isinstance(v, torch.Tensor))
    counted: dict = {}
    largest = 0
    for t in kept_tensors(obj):
        if hasattr(t, "to_local"):
            t = t.to_local()
        key = _storage_key(t)
        nbytes = t.untyped_storage().nbytes()
        if key in own or not nbytes or _holds_parameters(t, flats):
            continue
        counted[key] = max(counted.get(key, 0), nbytes)
        largest = max(largest, t.numel())
    return {"bytes": sum(counted.values()), "largest": largest}
