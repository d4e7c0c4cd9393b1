"""The converter of what leaves a rank (parlab.grading.plain), in the modes the labs use."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

from parlab.grading.numbers import plain_number as exported
from parlab.grading.plain import plain, plain_number

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_plain_number_keeps_numbers_and_describes_the_rest():
    assert exported is plain_number
    for v in (None, True, 3, 2.5):
        got = plain_number(v)
        assert got == v and type(got) is type(v)
    assert type(plain_number(np.int64(7))) is int and plain_number(np.int64(7)) == 7
    assert type(plain_number(np.float32(0.5))) is float and plain_number(Fraction(1, 4)) == 0.25
    assert plain_number("12") == {"type": "str", "repr": "'12'"}
    assert plain_number([1, 2]) == {"type": "list", "repr": "[1, 2]"}
    assert plain_number(torch.tensor(3.0))["type"] == "Tensor"
    long = plain_number("x" * 300)
    assert len(long["repr"]) == 203 and long["repr"].endswith("...")


def test_tensors_leave_as_cpu_copies_by_default():
    t = torch.ones(2, requires_grad=True)
    got = plain((t, [t, 1], {"k": "s"}))
    assert isinstance(got, tuple) and isinstance(got[1], tuple) and got[2] == {"k": "s"}
    assert not got[0].requires_grad and got[0].data_ptr() != t.data_ptr()
    assert torch.equal(got[1][0], t.detach()) and got[1][1] == 1


def test_other_objects_described_as_asked():
    obj = object()
    assert plain(obj, other="name") == "<object>"
    assert plain(obj, other="none") is None
    assert plain([1] * 60, containers=(), other="repr", clip=100) == repr([1] * 60)[:100]
    assert plain(obj)["type"] == "object"
    assert plain({"a": 1}, containers=(list, tuple), other="name") == "<dict>"
    with pytest.raises(ValueError):
        plain(obj, other="hide")


def test_one_element_tensors_as_numbers():
    # lab 01's pair of numbers, lab 04's loss
    assert plain(torch.tensor(7), keep=(bool, int, float), tensors="number") == 7
    assert plain(torch.ones(3), tensors="number", other="name") == "<Tensor>"
    loss = dict(keep=(float,), tensors="number", containers=(), as_float=True, other="name")
    assert type(plain(torch.tensor([2]), **loss)) is float and plain(3, **loss) == 3.0
    assert plain(True, **loss) == "<bool>" and plain("x", **loss) == "<str>" and plain(None, **loss) is None


def test_integers_through_tolist():
    # lab 06's coordinates: ints only, a bool or a float described
    ints = dict(keep=(int,), tensors="list", containers=(list, tuple))
    assert plain(torch.tensor([1, 2]), **ints) == (1, 2)
    assert plain(np.array([[0, 1], [2, 3]]), **ints) == ((0, 1), (2, 3))
    assert plain([np.int64(4), 5], **ints) == (4, 5)
    assert plain(True, **ints) == {"type": "bool", "repr": "True"}
    assert plain(1.5, **ints) == {"type": "float", "repr": "1.5"}


def test_only_tensors():
    # lab 03's outputs: a tensor, or None for anything else
    only = dict(keep=(), containers=(), other="none")
    assert torch.equal(plain(torch.ones(2), **only), torch.ones(2))
    assert plain(3, **only) is None and plain([torch.ones(1)], **only) is None
