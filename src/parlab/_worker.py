"""The program torchrun starts on every rank: ``python -m parlab._worker JOBDIR``.

It ties itself to torchrun, routes its output to per-rank files that the
notebook tails, prepares the rank (process group, device, seeds, threads),
runs the task and writes back either the result or the error.  Everything the
notebook needs to know travels through files in JOBDIR, written atomically.
"""
import faulthandler
import os
import pickle
import signal
import sys
import time

from parlab._procs import die_with_parent, start_time


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.part"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _route_output(job: str, rank: int) -> None:
    """Send fd 1 and 2 (C++ output included) to files the notebook tails."""
    for fd, name in ((1, "out"), (2, "err")):
        target = os.open(f"{job}/{name}.{rank}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout.reconfigure(line_buffering=True)
    sys.stderr.reconfigure(line_buffering=True)


def _format_error(exc: BaseException, labels: dict) -> str:
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in (__file__, _tasks_file()):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    from parlab._stacks import label_cells

    return label_cells(text, labels)


def _tasks_file() -> str:
    from parlab import _tasks

    return _tasks.__file__


def _report_error(job: str, rank: int, exc: BaseException, labels: dict, kind: str) -> None:
    def safe(describe):
        try:
            return describe()
        except Exception:  # noqa: BLE001 - an exception whose __str__ itself fails
            return f"<{type(exc).__name__} that cannot be printed>"

    record = {
        "rank": rank,
        "kind": kind,
        "exc_type": type(exc).__name__,
        "message": safe(lambda: str(exc)),
        "traceback": safe(lambda: _format_error(exc, labels)),
        "time": time.time(),
    }
    _atomic_write(f"{job}/error.{rank}", pickle.dumps(record))


def _prepare_rank(spec: dict, rank: int):
    import datetime
    import random

    import torch
    import torch.distributed as dist

    from parlab import runtime

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    timeout = datetime.timedelta(seconds=spec["pg_timeout"])
    if spec["backend"] == "nccl":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", timeout=timeout, device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group(spec["backend"], timeout=timeout)
    runtime._set_device(dev)
    seed = spec["seed"] + rank
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass


def main() -> None:
    job = sys.argv[1]
    rank = int(os.environ["RANK"])
    _route_output(job, rank)
    stack_file = open(f"{job}/stack.{rank}", "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    faulthandler.enable()  # a segfault prints the Python stack to this rank's stderr
    die_with_parent(int(os.environ.get("PARLAB_AGENT_PID", "0")) or None)
    with open(f"{job}/pid.{rank}", "w") as f:
        f.write(f"{os.getpid()} {start_time(os.getpid())}")

    with open(f"{job}/spec.pkl", "rb") as f:
        spec = pickle.load(f)
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    import linecache

    for name, source in spec["sources"].items():
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    labels = spec["cell_labels"]

    try:
        _prepare_rank(spec, rank)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        _report_error(job, rank, exc, labels, "init")
        _wait_to_be_ended()
    try:
        import cloudpickle

        with open(f"{job}/task.pkl", "rb") as f:
            task = cloudpickle.load(f)
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the notebook
        _report_error(job, rank, exc, labels, "setup")
        _wait_to_be_ended()

    try:
        result = task()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _report_error(job, rank, exc, labels, "raised")
            _wait_to_be_ended()
        result = None  # sys.exit() / sys.exit(0): a normal end, as under torchrun
    except BaseException as exc:  # noqa: BLE001
        _report_error(job, rank, exc, labels, "raised")
        _wait_to_be_ended()

    from parlab._pickling import dumps_result

    try:
        data = dumps_result(result)
    except Exception as exc:  # noqa: BLE001
        exc = TypeError(
            f"rank {rank} returned a {type(result).__name__!r} that cannot be pickled, so it "
            f"cannot be sent back to the notebook ({type(exc).__name__}: {exc}). Return tensors, "
            "numbers, strings, lists or dicts of them, or a state_dict() instead of the object."
        )
        _report_error(job, rank, exc, labels, "unpicklable_result")
        _wait_to_be_ended()
    _atomic_write(f"{job}/result.{rank}", data)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
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
