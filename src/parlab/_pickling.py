"""cloudpickle, but keeping each function's file name.

cloudpickle (3.1+) renames the code of functions it sends by value to
``<dynamic-code>``.  We keep the real name, so a rank's traceback can point at
``Cell In[7], line 4`` of the notebook and show that line.
"""
from __future__ import annotations

import io
import pickle
import types
from collections import ChainMap

import cloudpickle
from cloudpickle import cloudpickle as _impl


def _make_code(args: tuple, filename: str) -> types.CodeType:
    return types.CodeType(*args).replace(co_filename=filename)


def _reduce_code(code: types.CodeType):
    constructor, args = _impl._code_reduce(code)
    assert constructor is types.CodeType
    return _make_code, (args, code.co_filename)


class _Pickler(cloudpickle.Pickler):
    dispatch_table = ChainMap({types.CodeType: _reduce_code}, cloudpickle.Pickler.dispatch_table)


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


loads = cloudpickle.loads
