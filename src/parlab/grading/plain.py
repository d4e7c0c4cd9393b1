"""What leaves a rank: a student's returned value as plain data, the one converter.

No object of the student's may reach the grader (in the sandbox it could
run code there), yet a wrong answer must still get a message that shows
what came back.  ``plain(value, ...)`` turns a value into plain data:

- None stays None;
- a number stays a number: ``bool``, ``int``, ``float``, and numpy or torch
  scalars as ``int`` (integers) or ``float`` (other reals);
  ``as_float=True`` makes every non-bool number a ``float``;
- a ``str`` stays itself;
- a ``torch.Tensor``, by ``tensors``: ``"copy"``, a detached CPU clone;
  ``"number"``, the number of a one-element tensor (others are ``other``);
  ``"list"``, its ``tolist()`` (numpy arrays too), converted in turn;
  None, like any other object;
- a list or tuple, when its type is in ``containers``: a tuple of its items
  converted; a dict there: a dict of its values converted;
- a kept value is one whose type (after the rules above) is in ``keep``;
  anything else is described, by ``other``: ``"describe"``,
  ``{"type": name, "repr": repr clipped to clip characters + "..."}``;
  ``"name"``, ``"<TypeName>"``; ``"repr"``, ``repr(value)[:clip]``;
  ``"none"``, None.

``plain_number(value)`` is the converter for a returned number (labs 00,
03-06's prediction exercises): a number, None, or a described object.
"""
from __future__ import annotations

import sys
from numbers import Integral, Real

__all__ = ["plain", "plain_number", "NUMBERS"]

#: The types a returned number may have.
NUMBERS = (bool, int, float)
_DESCRIBE = ("describe", "name", "repr", "none")


def _number(value):
    """A numpy/torch/Fraction number as a Python one; anything else as it is."""
    if type(value) in NUMBERS or not isinstance(value, Real):
        return value
    return int(value) if isinstance(value, Integral) else float(value)


def _described(value, other: str, clip: int):
    if other == "name":
        return f"<{type(value).__name__}>"
    if other == "none":
        return None
    text = repr(value)
    if other == "repr":
        return text[:clip]
    return {"type": type(value).__name__,
            "repr": text[:clip] + "..." if len(text) > clip else text}


def plain(value, *, keep: tuple = (bool, int, float, str), tensors: str | None = "copy",
          containers: tuple = (list, tuple, dict), as_float: bool = False,
          other: str = "describe", clip: int = 200):
    """``value`` as plain data (see the module docstring for each argument)."""
    if other not in _DESCRIBE:
        raise ValueError(f"other must be one of {_DESCRIBE}, not {other!r}")
    again = dict(keep=keep, tensors=tensors, containers=containers, as_float=as_float,
                 other=other, clip=clip)
    if value is None:
        return None
    torch = sys.modules.get("torch")  # not imported: value is no tensor
    tensor = torch is not None and isinstance(value, torch.Tensor)
    if tensor and tensors == "copy":
        return value.detach().cpu().clone()
    if tensor and tensors == "number":
        if value.numel() != 1:
            return _described(value, other, clip)
        value = value.item()
    elif tensors == "list" and hasattr(value, "tolist") and not isinstance(value, NUMBERS):
        return plain(value.tolist(), **again)
    value = _number(value)
    if as_float and type(value) is int:
        value = float(value)
    if type(value) in (list, tuple) and type(value) in containers:
        return tuple(plain(v, **again) for v in value)
    if type(value) is dict and dict in containers:
        return {k: plain(v, **again) for k, v in value.items()}
    if type(value) in keep:
        return value
    return _described(value, other, clip)


def plain_number(value):
    """A returned number as plain data: a number, None, or ``{"type", "repr"}`` for anything
    else (a tensor, a string, a list included)."""
    return plain(value, keep=NUMBERS, tensors=None, containers=())
