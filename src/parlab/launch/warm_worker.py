"""The rank side of a warm group: a task that serves the notebook until told to stop.

A warm group is an ordinary launch whose task is :class:`WarmLoop`, so
``worker.py`` does the whole set-up exactly as for a cold launch (output
routing, stack dumps, die-with-parent, process group, device, seeds).  The
loop then connects back to the kernel over an authenticated connection
(``multiprocessing.connection`` with a per-group secret that only the
private job folder holds) and runs requests one at a time:

- ``run``: a pickled task (a function call or a ``%%rank`` cell); the reply
  is the result, an error record (plain JSON, as in ``error.r``), or
  "interrupted" when the kernel forwarded the stop button;
- ``reset``: empty this rank's namespace and seed again with ``seed + rank``;
- ``stop``: leave the loop; the worker then ends as after a cold launch.

Each rank keeps one namespace (:func:`state`) that ``%%rank`` cells run in, so
a model built in one cell is there in the next.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

_NAMESPACE: dict = {}
#: True while user code runs: only then does SIGINT (the forwarded stop button) raise.
_BUSY = False
_HERE = os.path.abspath(__file__)
#: Names every ``%%rank`` cell gets; hidden from ``names()``.
PROVIDED = ("rank", "world_size", "device", "torch", "dist", "parlab")


def state() -> dict:
    """This rank's namespace: what ``%%rank`` cells defined (``parlab.launch.warm.state()``)."""
    return _NAMESPACE


def names() -> list[str]:
    """The names a student defined on this rank, sorted (what ``WarmGroup.names()`` returns)."""
    return sorted(k for k in _NAMESPACE if not k.startswith("_") and k not in PROVIDED)


def _on_sigint(signum, frame):
    if _BUSY:
        raise KeyboardInterrupt


class WarmCell:
    """A ``%%rank`` cell: like ``tasks.CellTask``, but run in this rank's lasting namespace.

    A name the cell reads comes from the rank's namespace when an earlier cell
    defined it there; otherwise from the notebook (sent by value, as
    ``%%torchrun`` does), for this cell only unless the cell assigns it.
    """

    def __init__(self, source: str, filename: str, names: dict):
        self.source, self.filename, self.names = source, filename, names

    def __call__(self):
        import torch
        import torch.distributed as dist

        import parlab
        from parlab.launch.tasks import RESULT_NAME, split_last_expression

        ns = _NAMESPACE
        ns.update({"torch": torch, "dist": dist, "parlab": parlab, "rank": dist.get_rank(),
                   "world_size": dist.get_world_size(), "device": parlab.device()})
        ns.setdefault("__name__", "__main__")
        lent = {k: v for k, v in self.names.items() if k not in ns}
        ns.update(lent)
        ns.pop(RESULT_NAME, None)
        try:
            exec(compile(split_last_expression(self.source), self.filename, "exec"), ns)  # noqa: S102
            return ns.pop(RESULT_NAME, None)
        finally:
            for k, v in lent.items():
                if ns.get(k) is v:  # not reassigned by the cell: the notebook's, not the rank's
                    del ns[k]


class WarmLoop:
    """The task a warm group's worker runs: connect to the kernel, then serve it."""

    def __init__(self, address: tuple, authkey: bytes, seed: int):
        self.address, self.authkey, self.seed = address, authkey, seed

    def __call__(self):
        return serve(self.address, self.authkey, self.seed)


def _restack(rank: int) -> None:
    """Stack dumps go to ``stack.r`` opened for appending, so the kernel can empty it between dumps."""
    import faulthandler

    from parlab.launch.jobdir import JOB_ENV, JobDir

    path = JobDir(os.environ[JOB_ENV]).file("stack", rank)
    global _STACK_FILE
    _STACK_FILE = open(path, "a")
    faulthandler.register(signal.SIGUSR1, file=_STACK_FILE, all_threads=True)


def serve(address, authkey: bytes, seed: int):
    from multiprocessing.connection import Client

    import torch.distributed as dist

    from parlab.launch.worker import seed_everything

    rank = dist.get_rank()
    _restack(rank)
    conn = Client(address, authkey=authkey)
    import socket

    from parlab.wire import exclude_peer

    exclude_peer(address)  # this link carries cells and replies, not collectives

    with socket.socket(fileno=os.dup(conn.fileno())) as sock:  # replies go out at once
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.send_bytes(json.dumps({"rank": rank, "pid": os.getpid()}).encode())
    signal.signal(signal.SIGINT, _on_sigint)
    labels: dict = {}
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            _leave()  # the kernel is gone: nobody to serve
        from parlab.launch import pickling

        request = pickling.loads(data)  # from the kernel that authenticated this connection
        if request["kind"] == "stop":
            conn.close()
            return None
        if request["kind"] == "reset":
            _NAMESPACE.clear()
            seed_everything(seed + rank)
            header, payload = {"status": "ok"}, None
        else:
            header, payload = _run(request, rank, labels)
        header["id"] = request["id"]
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send_bytes(json.dumps(header).encode() + b"\n" + (payload or b""))  # one message: no Nagle wait


def _run(request: dict, rank: int, labels: dict):
    """Run one task; (reply header, result bytes or None)."""
    global _BUSY
    import linecache

    from parlab.launch import pickling
    from parlab.launch.worker import encode_result

    for name, source in request["sources"].items():
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    labels.update(request["labels"])
    phase = "setup"
    try:
        task = pickling.loads(request["task"])
        phase = "raised"
        _BUSY = True
        try:
            result = task()
        finally:
            _BUSY = False
        phase = "result"
        return {"status": "result"}, encode_result(result, False, rank)
    except KeyboardInterrupt as exc:
        return {"status": "interrupted", "where": _where(exc, labels)}, None
    except SystemExit as exc:
        if exc.code in (None, 0):
            return {"status": "result"}, encode_result(None, False, rank)
        return {"status": "error", "record": _record(exc, rank, labels, phase)}, None
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        return {"status": "error", "record": _record(exc, rank, labels, phase)}, None


def _trim(exc: BaseException) -> BaseException:
    """Drop this module's frames from the front of the traceback (the rest is the student's)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _HERE:
        tb = tb.tb_next
    return exc.with_traceback(tb)


def _record(exc: BaseException, rank: int, labels: dict, kind: str) -> dict:
    from parlab.launch.worker import format_error

    def safe(describe):
        try:
            return describe()
        except Exception:  # noqa: BLE001 - an exception whose __str__ itself fails
            return f"<{type(exc).__name__} that cannot be printed>"

    exc = _trim(exc)
    return {"rank": rank, "kind": kind, "exc_type": type(exc).__name__,
            "message": safe(lambda: str(exc)), "traceback": safe(lambda: format_error(exc, labels)),
            "time": time.time()}


def _where(exc: BaseException, labels: dict) -> str:
    """The innermost line of the student's code that the interrupt stopped."""
    import traceback

    frames = [f for f in traceback.extract_tb(_trim(exc).__traceback__) if f.filename != _HERE]
    if not frames:
        return "between tasks"
    f = frames[-1]
    place = f"{labels[f.filename]}, line {f.lineno}" if f.filename in labels else \
        f"{os.path.basename(f.filename)}:{f.lineno}"
    return f"at {place} in {f.name}"


def _leave() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
