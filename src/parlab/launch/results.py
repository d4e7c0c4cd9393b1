"""How a rank's return value travels back to the kernel.

By default a result is cloudpickled (any picklable object; tensors arrive
detached on the CPU).  With ``launch(..., plain_results=True)``, which grading
uses, a result must be plain data, checked on the rank, written with
``torch.save`` and read with ``torch.load(weights_only=True)``: loading it
can build tensors, numbers, strings and containers, and never runs code.
"""
from __future__ import annotations

import io

_SCALARS = (bool, int, float, str, bytes, type(None))


class NotPlainData(TypeError):
    """A result (or part of it) is not one of the plain types ``plain_results`` allows."""


def check_plain(obj, where: str = "the result", depth: int = 0) -> None:
    """Raise NotPlainData naming the first part of ``obj`` that is not plain data."""
    import torch

    if depth > 100:
        raise NotPlainData(f"{where} is nested more than 100 levels deep")
    kind = type(obj)
    if kind in _SCALARS or kind is torch.Tensor:
        return
    if kind in (list, tuple):
        for i, item in enumerate(obj):
            check_plain(item, f"{where}[{i}]", depth + 1)
        return
    if kind is dict:
        for key, value in obj.items():
            if type(key) not in (str, int):
                raise NotPlainData(f"{where} has a key of type {type(key).__name__!r}; "
                                   "dict keys must be str or int")
            check_plain(value, f"{where}[{key!r}]", depth + 1)
        return
    name = f"{kind.__module__}.{kind.__qualname__}" if kind.__module__ != "builtins" else kind.__name__
    raise NotPlainData(
        f"{where} is a {name!r}, which plain_results does not allow. Return only torch.Tensor "
        "(not a subclass), int, float, bool, str, bytes, None, and lists, tuples or dicts of them.")


def _to_cpu(obj):
    import torch

    if type(obj) is torch.Tensor:
        return obj.detach().cpu()
    if type(obj) in (list, tuple):
        return type(obj)(_to_cpu(x) for x in obj)
    if type(obj) is dict:
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def encode_plain(obj) -> bytes:
    """On the rank: check ``obj`` and serialise it with torch.save."""
    import torch

    check_plain(obj)
    buffer = io.BytesIO()
    torch.save(_to_cpu(obj), buffer)
    return buffer.getvalue()


def decode_plain(data: bytes):
    """In the kernel: load a rank's result without running any code, then check it again."""
    import torch

    value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    check_plain(value)
    return value


def encode(obj) -> bytes:
    """On the rank: any picklable result (tensors detached, on the CPU)."""
    from .pickling import dumps_result

    return dumps_result(obj)


def decode(data: bytes):
    from .pickling import loads

    return loads(data)
