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


class _ResultPickler(_Pickler):
    """Sends every tensor in a rank's result as a detached CPU tensor, in any container.

    The notebook kernel must never unpickle a CUDA tensor: that would create a
    CUDA context on a shared GPU in the kernel of every student who does it.
    """

    def reducer_override(self, obj):
        import torch

        if isinstance(obj, torch.Tensor) and (obj.device.type != "cpu" or obj.grad_fn is not None):
            plain = obj.detach().cpu()
            if isinstance(obj, torch.nn.Parameter):
                plain = torch.nn.Parameter(plain, requires_grad=obj.requires_grad)
            return plain.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return super().reducer_override(obj)


def dumps(obj, pickler=_Pickler) -> bytes:
    buffer = io.BytesIO()
    pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buffer.getvalue()


def dumps_result(obj) -> bytes:
    return dumps(obj, _ResultPickler)


loads = cloudpickle.loads
