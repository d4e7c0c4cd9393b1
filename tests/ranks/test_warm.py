"""Warm groups (parlab.start): the guarantees of a cold launch, on ranks that stay up.

Most tests share one 2-rank group; the fault tests restart it, as they must.
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import parlab
from parlab.launch import LaunchError, LaunchTimeout, WorkerError, procs, warm, warm_link
from parlab.launch.jobdir import jobs_root

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def group():
    g = parlab.start(nproc=2, timeout=60)
    yield g
    g.stop()


def rank_pids(g):
    pids = g.job.job.pids()
    return [(pids[r][0], pids[r][1]) for r in range(g.nproc)] + [(g.job.agent.pid, g.job.agent_token)]


def all_gone(pids, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(procs.same_process(*p) for p in pids):
            return True
        time.sleep(0.1)
    return False


def whoami(x):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(x)])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} says hi")
    return dist.get_rank() * 10 + t.item()


def test_bad_input_is_refused_before_anything_starts():
    before = set(os.listdir(jobs_root())) if os.path.isdir(jobs_root()) else set()
    with pytest.raises(ValueError, match="nproc must be at least 1"):
        parlab.start(nproc=0)
    with pytest.raises(TypeError, match="whole number of ranks"):
        parlab.start(nproc="2")
    with pytest.raises(ValueError, match="positive, finite"):
        parlab.start(nproc=2, timeout=-1)
    with pytest.raises(ValueError, match="unknown backend"):
        parlab.start(nproc=2, backend="tcp")
    with pytest.raises(TypeError, match="strings"):
        parlab.start(nproc=2, env={"A": 1})
    after = set(os.listdir(jobs_root())) if os.path.isdir(jobs_root()) else set()
    assert after <= before  # no job folder, so no process, was made


def test_results_come_back_in_rank_order_with_live_output(group, capsys):
    assert group.run(whoami, 1) == [2.0, 12.0]
    assert group.call(whoami, (2,)) == [4.0, 14.0]
    out = capsys.readouterr().out
    assert "[rank 0] rank 0 says hi" in out and "[rank 1] rank 1 says hi" in out


def test_bad_calls_are_refused_before_anything_is_sent(group):
    sent = group._ids
    with pytest.raises(TypeError, match="needs a function"):
        group.run(42)
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be pickled"):
        group.run(lambda: lock)
    assert group._ids == sent
    assert group.run(whoami, 0) == [0.0, 10.0]


def store(value):
    from parlab.launch.warm import state

    state()["model"] = value


def fetch(name):
    from parlab.launch.warm import state

    return state()[name]


def test_state_persists_between_calls_and_reset_clears_it(group):
    group.reset()
    assert group.names() == [[], []]
    group.run(store, 5)
    assert group.run(fetch, "model") == [5, 5]
    assert group.names() == [["model"], ["model"]]
    group.reset()
    assert group.names() == [[], []]
    with pytest.raises(WorkerError, match="KeyError"):
        group.run(fetch, "model")


def fails_on_rank_1():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ZeroDivisionError("rank 1 divides by zero")
    return "fine"


def test_a_rank_error_names_the_rank_and_the_group_stays_usable(group):
    before = rank_pids(group)
    with pytest.raises(WorkerError) as info:
        group.run(fails_on_rank_1)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ZeroDivisionError"
    assert "fails_on_rank_1" in err.remote_traceback and "raise ZeroDivisionError" in err.remote_traceback
    assert "rank 0: returned" in str(err) and "still running" in str(err)
    assert rank_pids(group) == before
    assert group.run(whoami, 1) == [2.0, 12.0]


def sleeps(seconds):
    import time

    time.sleep(seconds)
    return seconds


def test_a_hang_times_out_with_every_stack_then_the_group_restarts(group):
    before = rank_pids(group)
    started = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        group.call(sleeps, (600,), timeout=3)
    err = info.value
    assert sorted(err.stacks) == [0, 1]
    assert all("sleeps" in stack for stack in err.stacks.values())
    assert "restarted" in str(err) and "ran past its timeout of 3 s" in str(err)
    assert str(err).startswith("the cell did not finish within 3 s")  # a cell, not a launch
    assert all_gone(before, within=5)
    assert rank_pids(group) != before
    assert group.run(whoami, 1) == [2.0, 12.0]
    assert time.monotonic() - started < 120  # 3 s timeout, stacks, one restart (slow on a busy machine)


def test_the_stop_button_interrupts_every_rank_and_keeps_the_group(group, capsys):
    before = rank_pids(group)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        group.run(sleeps, 600)
    assert time.monotonic() - started < 6
    out = capsys.readouterr().out
    assert "rank 0: interrupted" in out and "rank 1: interrupted" in out and "kept" in out
    assert rank_pids(group) == before
    assert group.run(whoami, 1) == [2.0, 12.0]


def segfaults_on_rank_1():
    import ctypes

    import torch.distributed as dist

    if dist.get_rank() == 1:
        ctypes.string_at(0)
    return "fine"


def test_a_rank_that_segfaults_is_reported_and_the_group_restarted(group):
    before = rank_pids(group)
    with pytest.raises(WorkerError) as info:
        group.run(segfaults_on_rank_1)
    err = info.value
    assert err.rank == 1 and err.phase == "died" and err.exc_type == "SIGSEGV"
    assert "restarted" in str(err)
    assert all_gone(before, within=5)
    assert group.run(whoami, 1) == [2.0, 12.0]


def test_rank_cells_keep_their_namespace(group):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "parlab")
    assert warm.current() is group
    group.reset()
    assert ip.run_cell("%%rank\nw = rank + 1\nw * 10").result == [10, 20]
    ip.run_cell("y = 5")
    assert ip.run_cell("%%rank\nw + y").result == [6, 7]  # w from the rank, y from the notebook
    assert ip.run_line_magic("parlab", "names") == [["w"], ["w"]]  # y was lent, not stored
    failed = ip.run_cell("%%rank\nassert rank == 0, 'only rank 0 passes'")
    assert isinstance(failed.error_in_exec, WorkerError) and failed.error_in_exec.rank == 1
    assert ip.run_cell("%%rank\nw").result == [1, 2]
    ip.run_line_magic("parlab", "reset")
    assert group.names() == [[], []]
    with pytest.raises(ValueError, match="Usage: %parlab start"):
        ip.run_line_magic("parlab", "start --ranks 2")
    with pytest.raises(ValueError, match="Usage: %%rank"):
        ip.run_cell_magic("rank", "-n 4", "rank")


def test_only_the_starting_process_can_send_work(group):
    import multiprocessing

    def child(queue):
        try:
            group.run(whoami, 1)
            queue.put("sent")
        except LaunchError as exc:
            queue.put(str(exc))

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    answer = queue.get(timeout=30)
    proc.join(10)
    assert "only the kernel that started it can send it work" in answer
    assert group.run(whoami, 1) == [2.0, 12.0]


def test_the_handshake_refuses_a_wrong_secret_or_a_stranger():
    import socket
    from multiprocessing.connection import AuthenticationError, Client

    for key, pid in ((b"wrong", os.getpid()), (b"right", 1)):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        errors = []

        def connect():
            try:
                conn = Client(listener.getsockname(), authkey=key)
                conn.send_bytes(json.dumps({"rank": 0, "pid": pid}).encode())
            except (AuthenticationError, OSError, EOFError) as exc:
                errors.append(exc)

        client = threading.Thread(target=connect)
        client.start()
        sock, _ = listener.accept()
        assert warm_link.handshake(sock, b"right", {0: (os.getpid(), "token")}) == (None, None)
        client.join(10)
        listener.close()
        if key == b"wrong":
            assert errors and isinstance(errors[0], AuthenticationError)


OWNER = """
import json, sys, time, parlab
g = parlab.start(nproc=2, timeout=60)
pids = g.job.job.pids()
print(json.dumps([[g.job.agent.pid, g.job.agent_token]] + [list(pids[r]) for r in range(2)]), flush=True)
time.sleep(600)
"""


def test_a_sigkilled_owner_leaves_no_process():
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline()
        pids = [tuple(p) for p in json.loads(line)]
        assert all(procs.same_process(*p) for p in pids)
    finally:
        owner.kill()
        owner.wait()
    assert all_gone(pids, within=10)


def test_stop_ends_every_process_and_removes_the_folder(group):
    before, folder = rank_pids(group), group.job.job.path
    group.stop()
    assert all_gone(before, within=5)
    assert not os.path.exists(folder)
    with pytest.raises(LaunchError, match="stopped"):
        group.run(whoami, 1)
    group.stop()  # twice is fine


def debug_level():
    import os

    import torch.distributed as dist

    return os.environ.get("TORCH_DISTRIBUTED_DEBUG"), dist.get_debug_level().name


def test_the_diagnostic_mode_reaches_the_warm_ranks():
    with parlab.start(nproc=2, debug=True, timeout=60) as g:
        assert g.run(debug_level) == [("DETAIL", "DETAIL")] * 2
