"""The program torchrun starts on every rank: ``python -m parlab.launch.worker JOBDIR``.

It ties itself to torchrun, routes its output to per-rank files that the
notebook tails, prepares the rank (process group, device, seeds, threads),
runs the task and writes back either the result or the error.  Everything the
notebook needs to know travels through the job folder (``jobdir.py``).
"""
import faulthandler
import os
import signal
import sys
import time

from parlab.launch.jobdir import JobDir
from parlab.launch.procs import die_with_parent, start_time

_STORE = None


def _route_output(job: JobDir, rank: int) -> None:
    """Send fd 1 and 2 (C++ output included) to files the notebook tails."""
    for fd, kind in ((1, "out"), (2, "err")):
        target = os.open(job.file(kind, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def format_error(exc: BaseException, labels: dict) -> str:
    import traceback

    from parlab.launch import tasks
    from parlab.launch.stacks import label_cells

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, tasks.__file__):
        tb = tb.tb_next
    return label_cells("".join(traceback.format_exception(type(exc), exc, tb)), labels)


def _report_error(job: JobDir, rank: int, exc: BaseException, labels: dict, kind: str) -> None:
    """Write this rank's error record, then linger until the kernel ends the launch."""
    job.mark_ending(rank)  # first: the kernel waits for this record instead of asking for a stack

    def safe(describe):
        try:
            return describe()
        except Exception:  # noqa: BLE001 - an exception whose __str__ itself fails
            return f"<{type(exc).__name__} that cannot be printed>"

    job.write_error(rank, {
        "rank": rank,
        "kind": kind,
        "exc_type": type(exc).__name__,
        "message": safe(lambda: str(exc)),
        "traceback": safe(lambda: format_error(exc, labels)),
        "time": time.time(),
    })
    _wait_to_be_ended()


def init_method(backend: str) -> str:
    """What ``init_process_group`` gets: NCCL runs beside gloo so CPU tensors keep working."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def _prepare_rank(spec: dict, rank: int):
    import datetime

    import torch
    import torch.distributed as dist

    from parlab.launch import runtime

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    timeout = datetime.timedelta(seconds=spec["pg_timeout"])
    backend = spec["backend"]
    if backend == "auto":  # a Slurm launch: the node decides, one GPU per local rank or gloo
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        backend = "nccl" if gpus >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")) else "gloo"
    store = _signed_store(spec, timeout)
    if backend == "nccl":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group(init_method("nccl"), timeout=timeout, device_id=dev, **store)
    else:
        dev = torch.device("cpu")
        dist.init_process_group(init_method(backend), timeout=timeout, **store)
    runtime.bind_device(dev)
    seed_everything(spec["seed"] + rank)


def _signed_store(spec: dict, timeout) -> dict:
    """init_process_group's store arguments: torchrun's agent store, signed (``signed_store.py``).

    Empty (plain ``env://``) when torchrun does not share its agent's store.
    """
    import torch.distributed as dist

    from parlab.launch.jobdir import STORE_SECRET
    from parlab.launch.signed_store import SignedStore

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or STORE_SECRET not in spec:
        return {}
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    world = int(os.environ["WORLD_SIZE"])
    inner = dist.TCPStore(host, port, world, is_master=False, timeout=timeout)
    global _STORE  # c10d keeps only the C++ half: the Python object must outlive every group
    _STORE = SignedStore(inner, spec[STORE_SECRET], f"{host}:{port}")
    return {"store": _STORE, "rank": int(os.environ["RANK"]), "world_size": world}


def seed_everything(seed: int) -> None:
    """Seed random, torch and numpy (when installed) with ``seed``."""
    import random

    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def encode_result(result, plain: bool, rank: int) -> bytes:
    from parlab.launch import results

    if plain:
        return results.encode_plain(result)  # NotPlainData names the part that is not allowed
    try:
        return results.encode(result)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(
            f"rank {rank} returned a {type(result).__name__!r} that cannot be pickled, so it "
            f"cannot be sent back to the notebook ({type(exc).__name__}: {exc}). Return tensors, "
            "numbers, strings, lists or dicts of them, or a state_dict() instead of the object."
        ) from None


def _start_as_an_interpreter_would() -> None:
    """A rank forked from torchrun's agent (``fork_server.py``) drops the agent's signal handlers.

    torchrun turns SIGTERM, SIGINT, SIGHUP and SIGQUIT into exceptions in its agent; a rank that kept
    them would raise where a rank started as its own interpreter is simply ended.
    """
    import multiprocessing

    if multiprocessing.parent_process() is None:
        return
    for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCHLD", "SIGALRM"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    _start_as_an_interpreter_would()
    job = JobDir(sys.argv[1])
    rank = int(os.environ["RANK"])
    _route_output(job, rank)
    stack_file = open(job.file("stack", rank), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable()  # a segfault prints the Python stack to this rank's stderr
    import multiprocessing

    # a rank torchrun started by fork server (fork_server.py) is a child of multiprocessing's fork server
    forked = multiprocessing.parent_process() is not None
    die_with_parent(None if forked else int(os.environ.get("PARLAB_AGENT_PID", "0")) or None)
    job.write_pid(rank, os.getpid(), start_time(os.getpid()))

    spec = job.read_spec()
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    import linecache

    for name, source in spec["sources"].items():
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    labels = spec["cell_labels"]

    try:
        _prepare_rank(spec, rank)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        _report_error(job, rank, exc, labels, "init")
    try:
        import cloudpickle

        with open(job.task, "rb") as f:
            task = cloudpickle.load(f)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        _report_error(job, rank, exc, labels, "setup")

    try:
        result = task()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _report_error(job, rank, exc, labels, "raised")
        result = None  # sys.exit() / sys.exit(0): a normal end, as under torchrun
    except BaseException as exc:  # noqa: BLE001
        _report_error(job, rank, exc, labels, "raised")

    job.mark_ending(rank)
    try:
        data = encode_result(result, spec.get("plain_results", False), rank)
    except Exception as exc:  # noqa: BLE001
        _report_error(job, rank, exc, labels, "result")
    job.write_result(rank, data)
    import torch.distributed as dist

    if dist.is_initialized():
        try:  # the result is delivered; a peer that already closed its side is no error now
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    _exit_as_an_interpreter_would()


def _exit_as_an_interpreter_would() -> None:
    """Run the rank's ``atexit`` handlers when it was forked (``fork_server.py``).

    A forked rank ends through multiprocessing's ``os._exit``, which skips them; a rank started as
    its own interpreter runs them at exit, and a handler that fails there must be seen the same way.
    """
    import atexit
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()


def _wait_to_be_ended() -> None:
    """Stay alive briefly so the notebook can read the other ranks' stacks first."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(float(os.environ.get("PARLAB_ERROR_LINGER", "10")))
    os._exit(1)


if __name__ == "__main__":
    main()
