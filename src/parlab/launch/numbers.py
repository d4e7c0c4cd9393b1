"""The one check of a whole number given by the caller: every count (nproc, nnodes, gpus) and the seed."""
from __future__ import annotations

import operator


def whole(name: str, value, least: int, what: str = "a whole number") -> int:
    """``value`` as an int (numpy integers too, never a bool) of at least ``least``; raises naming ``name``."""
    try:
        if isinstance(value, bool):
            raise TypeError
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {value!r}") from None
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value}")
    return value
