"""The rule spy: how a student's code did its work, recorded on each rank.

A check that only compares results cannot see that a "ring" called
``dist.all_reduce``, that a "tree" was a chain of sends from the root, that
the input was overwritten, that a hook waited for its own all-reduce, or
that ``print`` never ran.  While a student's function runs inside
``Spy.watch()``, the spy records:

- every ``torch.distributed`` call made through the ``dist`` module (the op,
  the elements and dtype of its tensor, the peer, whether it was async,
  whether it ran during a backward pass, and when its work was waited on);
- how many backward passes ran (outermost ``Tensor.backward`` /
  ``torch.autograd.backward`` calls);
- what the function printed;
- whether torch's ``DistributedDataParallel`` was constructed;
- which inputs registered with ``guard`` were modified.

The record is plain data (lists, dicts, numbers, strings), so it travels
back from the ranks like any result, and the rules of an exercise
(``parlab.grading.harness.Rule``) are judged on it in the grader.

The spy patches module attributes for the duration of ``watch()`` only, so
the grader's own collectives outside it are never counted.  Code that bound
``torch.distributed.all_reduce`` to a name before the spy started is not
seen; the labs tell students to call collectives as ``dist.<op>``.
"""
from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

import torch
import torch.distributed as dist

from .records import ops, used  # noqa: F401 - reading a record; importable from here too

#: The torch.distributed functions the spy records, and how each names its peer.
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
               "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
               "gather", "scatter", "barrier", "all_gather_single", "reduce_scatter_single")
#: ``batch_isend_irecv`` is seen through the isend/irecv calls it makes.
POINT_TO_POINT = ("send", "recv", "isend", "irecv")
_PEER_ARG = {"send": "dst", "isend": "dst", "recv": "src", "irecv": "src"}


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def _global_peer(group, group_peer: int) -> int:
    """The global rank of a peer named by its rank in ``group`` (``batch_isend_irecv`` names
    peers as ``group_dst``/``group_src``)."""
    return int(group_peer) if group is None else dist.get_global_rank(group, int(group_peer))


class _Work:
    """Wraps an async work handle and notes when it was waited on."""

    def __init__(self, work, call: dict, spy: "Spy"):
        self._work, self._call, self._spy = work, call, spy

    def _note(self, blocking: bool = True) -> None:
        self._call["waited"] = True
        if blocking and self._spy.backward_depth:
            self._call["waited_in_backward"] = True

    def wait(self, *args, **kwargs):
        self._note()
        return self._work.wait(*args, **kwargs)

    def get_future(self):
        # Taking the future hands the wait to whoever holds it (DDP's comm hooks return
        # futures from inside backward): it counts as waited on, but it does not block.
        self._note(blocking=False)
        return self._work.get_future()

    def __getattr__(self, name):
        return getattr(self._work, name)


class _Tee(io.TextIOBase):
    """Writes through to the real stream and keeps a copy."""

    def __init__(self, stream, copy: list):
        self._stream, self._copy = stream, copy

    def write(self, text):
        self._copy.append(text)
        return self._stream.write(text)

    def flush(self):
        self._stream.flush()


class Spy:
    """One rank's record of how the student's code ran (see the module docstring)."""

    def __init__(self):
        self.calls: list[dict] = []
        self.printed: list[str] = []
        self.backward = 0
        self.backward_depth = 0
        self.ddp = 0
        self.mutated: list[str] = []
        self.events: list[dict] = []
        self._guarded: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self._paused = 0
        self._in_dist = 0
        self._watching = False

    # ------------------------------------------------------------ recording
    def guard(self, **tensors: torch.Tensor) -> None:
        """Remember these inputs so ``record()`` can tell whether they were modified."""
        for name, t in tensors.items():
            self._guarded.append((name, t, t.detach().clone()))

    def note(self, event: str, **facts) -> None:
        """Record something the grader's own code saw while the student's code ran.

        For example a callback handed to the student was called, or a forward
        pass or an optimizer step happened.  Events keep their order and carry
        the backward passes and dist calls counted so far; ``facts`` must be
        plain data.
        """
        self.events.append({"event": event, "backward": self.backward,
                            "calls": len(self.calls), **facts})

    def _wrap_dist(self, op: str, original):
        spy = self

        def recorded(*args, **kwargs):
            if spy._paused or spy._in_dist:  # the grader's own, or torch's send calling isend
                return original(*args, **kwargs)
            t = _first_tensor(args, kwargs)
            call = {"op": op, "numel": int(t.numel()) if t is not None else 0,
                    "dtype": str(t.dtype).replace("torch.", "") if t is not None else "",
                    "peer": None, "async": bool(kwargs.get("async_op", False)) or op in ("isend", "irecv"),
                    "in_backward": spy.backward_depth > 0, "waited": False,
                    "waited_in_backward": False}
            if op in _PEER_ARG:
                peer = kwargs.get(_PEER_ARG[op], args[1] if len(args) > 1 else None)
                if peer is None and kwargs.get("group_" + _PEER_ARG[op]) is not None:
                    peer = _global_peer(kwargs.get("group"), kwargs["group_" + _PEER_ARG[op]])
                call["peer"] = int(peer) if peer is not None else None
            spy.calls.append(call)
            spy._in_dist += 1
            try:
                work = original(*args, **kwargs)
            finally:
                spy._in_dist -= 1
            return _Work(work, call, spy) if work is not None and hasattr(work, "wait") else work
        return recorded

    def _wrap_backward(self, original):
        spy = self

        def counted(*args, **kwargs):
            if spy.backward_depth == 0:
                spy.backward += 1
            spy.backward_depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                spy.backward_depth -= 1
        return counted

    @contextlib.contextmanager
    def watch(self):
        """Record what happens inside the block (nestable: the inner block is a no-op)."""
        if self._watching:
            yield self
            return
        from torch.nn.parallel import DistributedDataParallel as DDP

        from torch.distributed import distributed_c10d as c10d

        patches: list[tuple[Any, str, Any]] = []
        for op in COLLECTIVES + POINT_TO_POINT:
            if hasattr(dist, op):
                wrapper = self._wrap_dist(op, getattr(dist, op))
                patches.append((dist, op, wrapper))
                if getattr(c10d, op, None) is getattr(dist, op):
                    # torch checks P2POp's op against c10d's own isend/irecv, and
                    # batch_isend_irecv calls them from there: patch both names.
                    patches.append((c10d, op, wrapper))
        patches.append((torch.Tensor, "backward", self._wrap_backward(torch.Tensor.backward)))
        patches.append((torch.autograd, "backward", self._wrap_backward(torch.autograd.backward)))
        ddp_init = DDP.__init__
        spy = self

        def ddp_built(module_self, *args, **kwargs):
            spy.ddp += 1
            return ddp_init(module_self, *args, **kwargs)
        patches.append((DDP, "__init__", ddp_built))
        patches.append((sys, "stdout", _Tee(sys.stdout, self.printed)))
        saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
        self._watching = True
        try:
            for obj, name, value in patches:
                setattr(obj, name, value)
            yield self
        finally:
            for obj, name, value in reversed(saved):
                setattr(obj, name, value)
            self._watching = False

    @contextlib.contextmanager
    def paused(self):
        """Inside ``watch()``, a block whose collectives are the grader's own (not recorded)."""
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def record(self) -> dict:
        """The plain-data record of everything seen so far."""
        mutated = list(self.mutated)
        for name, t, before in self._guarded:
            same = t.shape == before.shape and bool(torch.equal(t.detach(), before))
            if not same and name not in mutated:
                mutated.append(name)
        return {"calls": [dict(c) for c in self.calls], "printed": "".join(self.printed),
                "backward": self.backward, "ddp": self.ddp, "mutated": mutated,
                "events": [dict(e) for e in self.events]}

