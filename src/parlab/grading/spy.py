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
the grader's own collectives outside it are never counted.  Besides the
``dist.<op>`` functions it records calls that reach a backend another way
from code outside torch: the ``ProcessGroup`` and ``Backend`` methods
(``_get_default_group().allreduce([t])``) and the ``torch.ops.c10d`` and
``torch.ops._c10d_functional`` operators; torch's own use of them (DTensor,
``dist.<op>`` itself) is not recorded twice.  What is printed is read from
the rank's standard output itself (file descriptor 1) where that is a file,
as it is on every launched rank: whatever reaches the output, by ``print``,
``os.write(1, ...)`` or C code, counts, and nothing else does.

**What the record is worth.** It is made inside the process that runs the
answer, so an answer can change it (patch the spy away, call C++ directly,
write its rank's report itself).  It catches honest mistakes, and the
accidental ways around it above are closed; it is not evidence against a
student who sets out to deceive it.  ``docs/instructor.md`` ("What a
verdict rests on") says what the grader enforces regardless.
"""
from __future__ import annotations

import contextlib
import io
import os
import stat
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
#: Methods of ``ProcessGroup``/``Backend`` objects, by the ``dist`` function each stands for.
BACKEND_METHODS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
                   "broadcast": "broadcast", "allgather": "all_gather",
                   "_allgather_base": "all_gather_into_tensor", "allgather_coalesced": "all_gather",
                   "allgather_into_tensor_coalesced": "all_gather_into_tensor",
                   "all_gather_single": "all_gather_into_tensor", "reduce": "reduce",
                   "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
                   "reduce_scatter_single": "reduce_scatter_tensor",
                   "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor",
                   "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
                   "all_to_all_single": "all_to_all_single", "gather": "gather", "scatter": "scatter",
                   "barrier": "barrier", "monitored_barrier": "barrier", "send": "send", "recv": "recv",
                   "recv_anysource": "recv"}
#: Where the peer is among a backend method's arguments (after self) and a c10d operator's.
_METHOD_PEER = {"send": 1, "recv": 1}
_OP_PEER = {"send": 2, "recv": 2}
#: The operator namespaces whose operators run a collective or a message.
OP_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
_NOT_CALLS = ("wait_tensor", "check_for_nan")  # operators of those namespaces that move nothing
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _op_name(op: str) -> str:
    """The ``dist`` function a c10d operator stands for: "allreduce_" -> "all_reduce"."""
    base = op.strip("_").replace("_coalesced", "").replace("_any_source", "").removesuffix("_out").strip("_")
    names = {"allreduce": "all_reduce", "allgather": "all_gather", "allgather_base": "all_gather_into_tensor",
             "allgather_into_tensor": "all_gather_into_tensor", "reduce_scatter_base": "reduce_scatter_tensor",
             "alltoall": "all_to_all", "alltoall_base": "all_to_all_single", "monitored_barrier": "barrier"}
    return names.get(base, base)


#: torch's modules whose functions a student may call to reach a backend directly: the functional
#: collectives, and the ``dist`` functions themselves when bound to a name before ``watch()`` began
#: (``from torch.distributed import all_reduce``), where the patched ``dist.<op>`` is never called.
_DIRECT_ENTRIES = tuple(os.path.join(_TORCH_DIR, "distributed", name) for name in
                        ("_functional_collectives.py", "distributed_c10d.py", "c10d_logger.py"))


def _caller_is_torch(depth: int) -> bool:
    """Whether the call ``depth`` frames above the caller of this was made by torch's own code.

    A call from outside torch is not; nor is one from torch's functional
    collectives or its ``dist`` functions entered straight from outside
    torch (a ``dist`` function called through its patched name never gets
    here: that call is recorded once, as ``dist.<op>``).  One made inside
    anything else torch runs (DTensor, FSDP, a module's forward) is.
    """
    frame = sys._getframe(depth + 1)
    if not frame.f_code.co_filename.startswith(_TORCH_DIR):
        return False
    entry = frame
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        entry, frame = frame, frame.f_back
    return entry.f_code.co_filename not in _DIRECT_ENTRIES


_OPS: list[tuple[Any, str, Any]] = []


def _collective_ops() -> list[tuple[Any, str, Any]]:
    """(namespace, name, operator) of every operator of ``OP_NAMESPACES``, listed once per process."""
    if not _OPS:
        for full in torch._C._dispatch_get_all_op_names():
            space, _, name = full.partition("::")
            if space not in OP_NAMESPACES or "." in name or name in _NOT_CALLS:
                continue
            try:
                _OPS.append((space, name, getattr(getattr(torch.ops, space), name)))
            except (AttributeError, RuntimeError):
                continue
    return _OPS


class _Op:
    """A c10d operator (an ``OpOverloadPacket`` or one overload) that records its calls."""

    def __init__(self, target, record):
        self._target, self._record = target, record

    def __call__(self, *args, **kwargs):
        return self._record(self._target, args, kwargs, _caller_is_torch(1))

    def __getattr__(self, name):
        value = getattr(self._target, name)
        return _Op(value, self._record) if name in getattr(self._target, "overloads", lambda: ())() else value


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def _group_size(group) -> int | None:
    """The number of ranks in a ``group=`` argument, or None when it cannot be read."""
    try:
        return int(dist.get_world_size(group))
    except Exception:  # noqa: BLE001 - not a group this rank belongs to, or not a group at all
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


class _Output:
    """What reaches this process's standard output (fd 1) while watched, when fd 1 is a file.

    A launched rank's fd 1 is its output file in the launch folder (opened to
    append), so the bytes added to it between ``start`` and ``stop`` are what
    the rank printed, however it printed them.  Elsewhere (a notebook's
    kernel, a pipe) ``available`` is False and the spy tees ``sys.stdout``.
    """

    LIMIT = 1 << 20  # bytes kept per watch

    def __init__(self):
        try:  # print() must reach fd 1 (not so under a test's capsys) and fd 1 must be a file
            self.available = sys.stdout.fileno() == 1 and stat.S_ISREG(os.fstat(1).st_mode)
        except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
            self.available = False
        self._start = 0

    def _flush(self) -> None:
        for stream in (sys.stdout, sys.__stdout__):
            try:
                stream.flush()
            except (AttributeError, ValueError, OSError):
                pass

    def start(self) -> None:
        self._flush()
        self._start = os.fstat(1).st_size

    def stop(self) -> str:
        self._flush()
        try:
            with open("/proc/self/fd/1", "rb") as f:
                f.seek(self._start)
                return f.read(self.LIMIT).decode("utf-8", "replace")
        except OSError:
            return ""


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
            peer = None
            if op in _PEER_ARG:
                peer = kwargs.get(_PEER_ARG[op], args[1] if len(args) > 1 else None)
                if peer is None and kwargs.get("group_" + _PEER_ARG[op]) is not None:
                    peer = _global_peer(kwargs.get("group"), kwargs["group_" + _PEER_ARG[op]])
            group = kwargs.get("group")
            extra = {"group_size": _group_size(group)} if group is not None else {}
            call = spy._call(op, args, kwargs, peer,
                             bool(kwargs.get("async_op", False)) or op in ("isend", "irecv"), **extra)
            return spy._through(call, original, args, kwargs)
        return recorded

    def _call(self, op: str, args, kwargs, peer, is_async: bool, **extra) -> dict:
        """A new record of one call (its first tensor's size and dtype, its peer), kept in order."""
        t = _first_tensor(args, kwargs)
        call = {"op": op, "numel": int(t.numel()) if t is not None else 0,
                "dtype": str(t.dtype).replace("torch.", "") if t is not None else "",
                "peer": int(peer) if peer is not None else None, "async": is_async,
                "in_backward": self.backward_depth > 0, "waited": False,
                "waited_in_backward": False, **extra}
        self.calls.append(call)
        return call

    def _through(self, call: dict, original, args, kwargs):
        """``original(*args, **kwargs)`` with nothing inside it recorded; its work handle watched."""
        self._in_dist += 1
        try:
            work = original(*args, **kwargs)
        finally:
            self._in_dist -= 1
        return _Work(work, call, self) if work is not None and hasattr(work, "wait") else work

    def _record_raw(self, op: str, via: str, original, args, kwargs, peer_at: int | None, by_torch: bool):
        """One call that reached a backend without ``dist.<op>``, recorded as ``op`` (torch's own calls are not)."""
        if self._paused or self._in_dist or by_torch:
            return original(*args, **kwargs)
        peer = args[peer_at] if peer_at is not None and len(args) > peer_at else None
        call = self._call(op, args, kwargs, peer if isinstance(peer, int) else None, True, via=via)
        return self._through(call, original, args, kwargs)

    def _wrap_method(self, cls, name: str):
        spy, original, op = self, getattr(cls, name), BACKEND_METHODS[name]
        peer_at = None if op not in _METHOD_PEER else _METHOD_PEER[op] + 1  # + self

        def recorded(*args, **kwargs):
            return spy._record_raw(op, f"{cls.__name__}.{name}", original, args, kwargs, peer_at,
                                   _caller_is_torch(1))
        return recorded

    def _op_patches(self) -> list:
        """(namespace, name, recording proxy) for every collective operator torch has registered."""
        spy, patches = self, []
        for space, name, packet in _collective_ops():
            op = _op_name(name)
            peer_at = _OP_PEER.get(op) if space == "c10d" else None

            def record(target, args, kwargs, by_torch, op=op, via=f"torch.ops.{space}.{name}", at=peer_at):
                return spy._record_raw(op, via, target, args, kwargs, at, by_torch)
            patches.append((getattr(torch.ops, space), name, _Op(packet, record)))
        return patches

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
        for cls in (c10d.ProcessGroup, torch._C._distributed_c10d.Backend):
            patches += [(cls, name, self._wrap_method(cls, name)) for name in BACKEND_METHODS
                        if name in vars(cls)]
        patches += self._op_patches()
        patches.append((torch.Tensor, "backward", self._wrap_backward(torch.Tensor.backward)))
        patches.append((torch.autograd, "backward", self._wrap_backward(torch.autograd.backward)))
        ddp_init = DDP.__init__
        spy = self

        def ddp_built(module_self, *args, **kwargs):
            spy.ddp += 1
            return ddp_init(module_self, *args, **kwargs)
        patches.append((DDP, "__init__", ddp_built))
        output = _Output()
        if not output.available:
            patches.append((sys, "stdout", _Tee(sys.stdout, self.printed)))
        # a class's own entry, not getattr's: pybind11 keeps methods as descriptors that bind self
        saved = [(obj, name, vars(obj)[name] if isinstance(obj, type) and name in vars(obj) else getattr(obj, name))
                 for obj, name, _ in patches]
        self._watching = True
        try:
            for obj, name, value in patches:
                setattr(obj, name, value)
            if output.available:
                output.start()
            yield self
        finally:
            if output.available:
                self.printed.append(output.stop())
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

