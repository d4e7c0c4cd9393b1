"""What lab 07's rules need beyond the spy: when attention is computed, and on what.

``watching(spy)`` runs inside ``spy.watch()`` and adds events to the spy's
record (``spy.note``), so they travel back with it:

- ``compute``: a matmul-like torch call (matmul, bmm, einsum, baddbmm,
  ``@``, scaled_dot_product_attention), with the storages of its tensor
  arguments, seen through a ``TorchFunctionMode``;
- ``sent`` / ``received``: a point-to-point send or receive (``dist.isend``,
  ``dist.send``, ``dist.irecv``, ``dist.recv``, also when
  ``batch_isend_irecv`` makes them), with the storage of the tensor;
- ``a2a``: an ``all_to_all_single``, with whether split sizes were given.

Each event carries ``calls`` (how many dist calls the spy had seen before
it) and ``in_backward``; the events' order is the order things happened
(one ``batch_isend_irecv`` notes its ops in the order they are listed);
``parlab.grading.records.events(record, kind, backward=False)`` reads them.
Storages are compared by data pointer: a view (``k.transpose(-1, -2)``)
shares its tensor's storage.  Every tensor noted is kept alive until
``watching`` ends, so no pointer is reused for another tensor within a case.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.overrides import TorchFunctionMode

_COMPUTE = {"matmul", "bmm", "einsum", "baddbmm", "__matmul__", "__rmatmul__", "mm",
            "scaled_dot_product_attention"}


def _storages(values, alive: list) -> list[int]:
    """The data pointers of the tensors in ``values``; the tensors are appended to ``alive``."""
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            alive.append(v)
            out.append(int(v.untyped_storage().data_ptr()))
        elif isinstance(v, (list, tuple)):
            out.extend(_storages(v, alive))
    return out


class _Compute(TorchFunctionMode):
    def __init__(self, spy, alive: list):
        super().__init__()
        self.spy, self.alive = spy, alive

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _COMPUTE:
            self.spy.note("compute", in_backward=self.spy.backward_depth > 0,
                          storages=_storages(list(args) + list(kwargs.values()), self.alive))
        return func(*args, **kwargs)


@contextlib.contextmanager
def watching(spy):
    """Inside ``spy.watch()``: note compute, sends and all-to-all splits in ``spy``'s record."""
    patches, alive = [], []  # alive: every tensor noted, so that no data pointer is reused

    def p2p(kind):
        def make(original):
            def wrapper(tensor, *args, **kwargs):
                spy.note(kind, in_backward=spy.backward_depth > 0, storages=_storages([tensor], alive))
                return original(tensor, *args, **kwargs)
            return wrapper
        return make

    def a2a(original):
        def wrapper(output, input, output_split_sizes=None, input_split_sizes=None, *args, **kwargs):
            spy.note("a2a", in_backward=spy.backward_depth > 0, splits=output_split_sizes is not None,
                     dtype=str(input.dtype).replace("torch.", ""))
            return original(output, input, output_split_sizes, input_split_sizes, *args, **kwargs)
        return wrapper

    for name, make in (("isend", p2p("sent")), ("send", p2p("sent")), ("irecv", p2p("received")),
                       ("recv", p2p("received")), ("all_to_all_single", a2a)):
        wrapped = make(getattr(dist, name))
        patches.append((dist, name, wrapped))
        if hasattr(c10d, name):
            patches.append((c10d, name, wrapped))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        with _Compute(spy, alive):
            yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)
        alive.clear()
