"""The launcher: results, notebook-style code, errors, hangs, bad input, cleanup.

Every test that starts ranks checks afterwards that none of its processes
is left, by the pids the ranks reported themselves.
"""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.distributed as dist

import parlab
from parlab.launch import failures, jobdir, options
from parlab.launch.procs import alive

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


# ----------------------------------------------------------------- rank functions


def whoami(scale):
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": t * scale,
            "device": str(parlab.device()), "seed_draw": torch.rand(1).item()}


def record_pids(path):
    """Append 'rank pid ppid grandparent' so the test can check these processes are gone later.

    The grandparent is torchrun's agent when the rank was forked (by multiprocessing's fork server, which
    the agent forked from the kernel's ``parlab.launch.fork_server`` started), or the kernel itself.
    """
    import psutil

    grandparent = psutil.Process(os.getppid()).ppid()
    with open(path, "a") as f:
        f.write(f"{dist.get_rank()} {os.getpid()} {os.getppid()} {grandparent}\n")


def fail_on_rank_one(path):
    record_pids(path)
    if dist.get_rank() == 1:
        time.sleep(0.5)
        raise ValueError("rank one is unhappy")
    t = torch.ones(2)
    dist.all_reduce(t)  # the other ranks wait here for rank 1
    return t


def sleep_forever(path):
    record_pids(path)
    while True:
        time.sleep(0.2)


def collective_on_rank_zero_only(path):
    record_pids(path)
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(60)  # alive but never joining: the collective must time out


def mismatched_collectives():
    t = torch.ones(4)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=1)


def return_generator():
    return (i for i in range(3))


def chatty(n):
    for i in range(n):
        print(f"line {i}")
    return n


def pids_from(path):
    with open(path) as f:
        rows = [line.split() for line in f if line.strip()]
    return {int(r[0]): (int(r[1]), int(r[2])) for r in rows}


def assert_all_gone(path, wait=5.0):
    procs = {pid for pid, _ in pids_from(path).values()} | {ppid for _, ppid in pids_from(path).values()}
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and any(alive(p) and not _zombie(p) for p in procs):
        time.sleep(0.1)
    left = [p for p in procs if alive(p) and not _zombie(p)]
    assert not left, f"processes left behind: {left}"


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


def assert_no_job_dirs():
    root = jobdir.jobs_root()
    left = [n for n in os.listdir(root) if n.startswith(f"launch-{os.getpid()}-")] if os.path.isdir(root) else []
    assert not left, f"job folders left on disk: {left}"


# ----------------------------------------------------------------- results


def test_results_come_back_in_rank_order():
    out = parlab.launch(whoami, args=(2.0,), nproc=3)
    assert [r["rank"] for r in out] == [0, 1, 2]
    assert all(r["world"] == 3 for r in out)
    assert all(torch.equal(r["sum"], torch.tensor([12.0])) for r in out)  # (1+2+3) * 2
    assert all(r["device"] == "cpu" for r in out)
    draws = [r["seed_draw"] for r in out]
    assert len(set(draws)) == 3, "ranks must be seeded differently"
    assert parlab.launch(whoami, args=(1.0,), nproc=3)[1]["seed_draw"] == draws[1], "seeds must be repeatable"
    assert_no_job_dirs()


def test_notebook_style_functions_classes_and_closures_travel_by_value(tmp_path):
    # Code defined in __main__ (like a notebook cell) is not importable by the ranks.
    source = textwrap.dedent("""
        import torch, torch.distributed as dist

        class Doubler:
            def __init__(self, k):
                self.k = k
            def __call__(self, t):
                return t * 2 * self.k

        def make(k):
            d = Doubler(k)
            def work(x):
                t = torch.full((2,), float(x + dist.get_rank()))
                dist.all_reduce(t)
                return d(t)
            return work
    """)
    namespace = {"__name__": "__main__"}
    exec(compile(source, str(tmp_path / "cell.py"), "exec"), namespace)
    out = parlab.launch(namespace["make"](10), args=(1,), nproc=2)
    # ranks hold 1 and 2 -> sum 3 -> doubled and scaled by 10
    assert [o.tolist() for o in out] == [[60.0, 60.0], [60.0, 60.0]]


def test_kwargs_env_and_seed_reach_the_ranks():
    def read(name, *, suffix):
        import random
        return os.environ.get(name, "") + suffix, random.random()

    out = parlab.launch(read, args=("PARLAB_TEST_VALUE",), kwargs={"suffix": "!"}, nproc=2,
                        env={"PARLAB_TEST_VALUE": "hi"}, seed=5)
    assert [o[0] for o in out] == ["hi!", "hi!"]
    import random
    random.seed(6)
    assert out[1][1] == random.random()  # rank 1 uses seed + 1


# ----------------------------------------------------------------- errors


def test_rank_error_names_first_failing_rank_with_its_traceback(tmp_path):
    pids = tmp_path / "pids"
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(fail_on_rank_one, args=(str(pids),), nproc=3)
    err = info.value
    assert err.rank == 1 and err.exc_type == "ValueError"
    assert "rank one is unhappy" in err.remote_traceback
    assert "in fail_on_rank_one" in err.remote_traceback
    assert 'raise ValueError("rank one is unhappy")' in err.remote_traceback  # the source line itself
    message = str(err)
    assert message.startswith("rank 1 failed: ValueError: rank one is unhappy")
    assert "rank 0: in all_reduce" in message and "rank 2: in all_reduce" in message
    assert "test_launcher.py" in err.stacks[0]
    assert isinstance(err, parlab.LaunchError)
    assert_all_gone(pids)
    assert_no_job_dirs()


def test_collective_that_one_rank_never_joins_fails_fast_with_a_hint(tmp_path):
    pids = tmp_path / "pids"
    start = time.monotonic()
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(collective_on_rank_zero_only, args=(str(pids),), nproc=2, timeout=30)
    assert time.monotonic() - start < 30, "the process-group timeout must fire before the launch timeout"
    message = str(info.value)
    assert info.value.rank == 0
    assert "timed out" in message.lower() and "debug=True" in message
    assert "rank 1: at test_launcher.py" in message and "in collective_on_rank_zero_only" in message
    assert_all_gone(pids)


def test_debug_mode_names_mismatched_collectives():
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(mismatched_collectives, nproc=2, timeout=60, debug=True)
    text = str(info.value)
    assert "ALLREDUCE" in text.upper() and "BROADCAST" in text.upper(), text


def test_timeout_reports_where_every_rank_was_and_cleans_up(tmp_path):
    pids = tmp_path / "pids"
    with pytest.raises(parlab.LaunchTimeout) as info:
        parlab.launch(sleep_forever, args=(str(pids),), nproc=2, timeout=15)
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, parlab.LaunchError)
    assert set(err.stacks) == {0, 1}
    assert "in sleep_forever" in err.stacks[0]
    assert "rank 0: at test_launcher.py" in str(err) and "in sleep_forever" in str(err)
    assert_all_gone(pids)
    assert_no_job_dirs()


def test_unpicklable_return_value_is_named():
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(return_generator, nproc=2)
    assert "returned a 'generator' that cannot be pickled" in str(info.value)


# ----------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs, error, words", [
    ({"nproc": 0}, ValueError, "at least 1"),
    ({"nproc": -2}, ValueError, "at least 1"),
    ({"nproc": 2.5}, TypeError, "whole number"),
    ({"backend": "tcp"}, ValueError, "unknown backend"),
    ({"timeout": 0}, ValueError, "positive, finite number"),
    ({"env": {"X": 1}}, TypeError, "strings"),
    ({"args": 5}, TypeError, "tuple"),
    ({"args": (threading.Lock(),)}, TypeError, "argument 0 (lock) cannot be sent"),
])
def test_bad_input_is_rejected_before_anything_starts(kwargs, error, words):
    start = time.monotonic()
    with pytest.raises(error, match=None) as info:
        parlab.launch(whoami, **{"args": (1.0,), **kwargs})
    assert words in str(info.value)
    assert time.monotonic() - start < 2


def test_function_that_cannot_be_pickled_is_named():
    lock = threading.Lock()
    with pytest.raises(TypeError, match="the function cannot be sent"):
        parlab.launch(lambda: lock.locked(), nproc=2)


def test_gpu_requests_on_a_machine_without_gpus(monkeypatch):
    monkeypatch.setattr(options, "_visible_gpus", lambda: 0)
    with pytest.raises(parlab.LaunchError, match="needs GPUs, but this machine has none"):
        parlab.launch(whoami, args=(1.0,), nproc=2, backend="nccl")


def test_more_nccl_ranks_than_gpus(monkeypatch):
    monkeypatch.setattr(options, "_visible_gpus", lambda: 2)
    with pytest.raises(ValueError, match="nproc=4 but only 2 GPU"):
        parlab.launch(whoami, args=(1.0,), nproc=4, backend="nccl")


def test_default_backend_and_nproc(monkeypatch):
    monkeypatch.setattr(options, "_visible_gpus", lambda: 0)
    assert options.choose_backend(None, None) == (2, "gloo")
    monkeypatch.setattr(options, "_visible_gpus", lambda: 8)
    assert options.choose_backend(None, None) == (8, "nccl")
    assert options.choose_backend(4, None) == (4, "nccl")
    assert options.choose_backend(9, None) == (9, "gloo")


# ----------------------------------------------------------------- output


def test_output_is_prefixed_and_bounded(capsys, monkeypatch):
    monkeypatch.setenv("PARLAB_MAX_LINES", "40")
    assert parlab.launch(chatty, args=(500,), nproc=2) == [500, 500]
    out = capsys.readouterr().out.splitlines()
    for rank in (0, 1):
        mine = [line for line in out if line.startswith(f"[rank {rank}] ")]
        assert f"[rank {rank}] line 0" in mine and f"[rank {rank}] line 499" in mine  # head and tail
        assert len([line for line in mine if "not shown" not in line]) <= 20


def test_suppressed_line_count_is_reported(capfd, monkeypatch):
    monkeypatch.setenv("PARLAB_MAX_LINES", "20")
    parlab.launch(chatty, args=(100,), nproc=2)
    captured = capfd.readouterr()
    assert "[rank 0] ... 90 lines from rank 0 not shown ..." in captured.out
    assert captured.err == ""  # headless: a correct answer writes nothing to stderr


# ----------------------------------------------------------------- scripts, doctor


def test_run_script_runs_a_torchrun_style_file(tmp_path, capfd):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys, torch, torch.distributed as dist
        dist.init_process_group("gloo")          # a torchrun script sets up its own group
        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        print("total", int(t.item()), "args", sys.argv[1:])
    """))
    assert parlab.run_script(script, nproc=2, args=["--lr", 0.1]) == [None, None]
    out = capfd.readouterr().out
    assert "[rank 1] total 3 args ['--lr', '0.1']" in out


def test_doctor_reports_and_exits_zero():
    proc = subprocess.run([sys.executable, "-m", "parlab", "doctor"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch" in proc.stdout and "gloo yes" in proc.stdout and "all_reduce" in proc.stdout


# ----------------------------------------------------------------- cleanup


LAUNCHING_SCRIPT = """
import signal, sys, parlab
# A kernel handles SIGINT (the stop button) even when this test runs from a shell that
# started it in the background, where SIGINT arrives ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {tests!r})
import test_launcher as t
parlab.launch(t.sleep_forever, args=({pids!r},), nproc=2, timeout=200)
"""


def _start_launching_process(tmp_path):
    pids = tmp_path / "pids"
    script = tmp_path / "kernel.py"
    script.write_text(LAUNCHING_SCRIPT.format(tests=os.path.dirname(__file__), pids=str(pids)))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (not pids.exists() or len(pids_from(pids)) < 2):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    assert len(pids_from(pids)) == 2, "the ranks never started"
    return proc, pids


def test_interrupt_stops_every_rank_and_says_where_they_were(tmp_path):
    proc, pids = _start_launching_process(tmp_path)
    proc.send_signal(signal.SIGINT)  # what Jupyter's stop button does
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the interrupted launch did not end within 60 s:\n{out}\n{err}") from None
    assert "KeyboardInterrupt" in err
    assert "Interrupted. Where the ranks were:" in err and "in sleep_forever" in err
    assert_all_gone(pids)


def test_killed_kernel_takes_its_ranks_with_it(tmp_path):
    proc, pids = _start_launching_process(tmp_path)
    with open(pids) as f:
        servers = {int(line.split()[3]) for line in f if line.strip()} - {proc.pid}
    assert servers, "the ranks were not forked"
    os.kill(proc.pid, signal.SIGKILL)  # a kernel restart or crash
    proc.communicate(timeout=30)
    assert_all_gone(pids, wait=5.0)
    assert not [p for p in servers if alive(p) and not _zombie(p)], "the forked torchrun outlived its kernel"
    # The dead kernel's job folder is swept by the next launch on the machine.
    root = jobdir.jobs_root()
    mine = [n for n in os.listdir(root) if n.startswith(f"launch-{proc.pid}-")]
    assert mine, "expected the killed kernel's folder to exist until the next sweep"
    jobdir.sweep_stale_jobs()
    assert not [n for n in os.listdir(root) if n.startswith(f"launch-{proc.pid}-")]


def torchrun_of(rank_pid: int) -> int:
    """The torchrun agent above a rank: its parent when started cold (``-m parlab.launch.agent``), else
    the parent of the rank's parent, multiprocessing's fork server (forked from the agent, so with the
    kernel's fork server's command line, or started by multiprocessing)."""
    import psutil

    parent = psutil.Process(rank_pid).parent()
    forked = any(name in " ".join(parent.cmdline())
                 for name in ("multiprocessing.forkserver", "parlab.launch.fork_server"))
    return parent.ppid() if forked else parent.pid


def test_killed_torchrun_is_reported_and_its_ranks_end(tmp_path):
    pids = tmp_path / "pids"

    def kill_agent_when_ranks_run():
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if pids.exists() and len(pids_from(pids)) == 2:
                os.kill(torchrun_of(pids_from(pids)[0][0]), signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_agent_when_ranks_run)
    killer.start()
    with pytest.raises(parlab.LaunchError, match="killed by signal 9"):
        parlab.launch(sleep_forever, args=(str(pids),), nproc=2, timeout=120)
    killer.join()
    assert_all_gone(pids)
    assert_no_job_dirs()


def test_no_torchelastic_folders_are_left_in_tmp():
    import tempfile

    before = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("torchelastic_")}
    parlab.launch(whoami, args=(1.0,), nproc=2)
    after = {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("torchelastic_")}
    assert after == before


CONCURRENT_SCRIPT = """
import sys, torch, parlab
sys.path.insert(0, {tests!r})
import test_launcher as t
out = parlab.launch(t.whoami, args=(float({k}),), nproc=2, timeout=200)
assert [o["sum"].item() for o in out] == [3.0 * {k}] * 2, out
print("ok", {k})
"""


def test_eight_concurrent_launches_do_not_collide(tmp_path):
    procs = []
    for k in range(8):
        script = tmp_path / f"student{k}.py"
        script.write_text(CONCURRENT_SCRIPT.format(tests=os.path.dirname(__file__), k=k + 1))
        procs.append(subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=220) for p in procs]
    for k, (p, (out, err)) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"launch {k} failed:\n{out}\n{err}"
        assert f"ok {k + 1}" in out


def test_default_timeout_is_below_the_course_cell_timeout():
    from traitlets.config.loader import PyFileConfigLoader

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    config = PyFileConfigLoader("nbgrader_config.py", path=root).load_config()
    cell_timeout = config.Execute.timeout
    assert options.DEFAULT_TIMEOUT < cell_timeout, (options.DEFAULT_TIMEOUT, cell_timeout)


def test_a_connection_failure_while_forming_the_group_is_retried_once(monkeypatch, capfd):
    real_errors = jobdir.JobDir.errors
    injected = []

    def first_attempt_fails(self, nproc):
        if not injected or injected[0] == self.path:  # what gloo reports when a connection drops during init
            injected[:] = [self.path]
            return {0: {"rank": 0, "kind": "init", "exc_type": "RuntimeError", "time": 0.0,
                        "message": "Gloo connectFullMesh failed with ... Connection closed by peer",
                        "traceback": "RuntimeError: Gloo connectFullMesh failed"}}
        return real_errors(self, nproc)

    monkeypatch.setattr(jobdir.JobDir, "errors", first_attempt_fails)
    out = parlab.launch(whoami, args=(1.0,), nproc=2)
    assert [o["rank"] for o in out] == [0, 1]
    captured = capfd.readouterr()
    assert "starting them once more" in captured.out and captured.err == ""
    assert not os.path.exists(injected[0]), "the failed attempt's folder must be removed"


def test_only_failures_before_user_code_count_as_transient():
    text = "Gloo connectFullMesh failed: Connect timeout"
    assert failures.transient_reason("init", text) == "connectFullMesh"
    assert failures.transient_reason("raised", text) == ""
    assert failures.transient_reason("init", "CUDA error: out of memory") == ""


def init_again():
    dist.init_process_group("gloo")


def test_calling_init_process_group_again_gets_a_hint():
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(init_again, nproc=2)
    assert "remove init_process_group" in str(info.value)


# ----------------------------------------------------------------- review findings


def exit_on_rank_one(path, how):
    record_pids(path)
    if dist.get_rank() == 1:
        time.sleep(0.5)
        if how == "exit":
            os._exit(3)
        import ctypes
        ctypes.string_at(0)  # segfault
    dist.all_reduce(torch.ones(1))


@pytest.mark.parametrize("how, words, exc_type", [
    ("exit", "it exited with code 3", "exit code 3"),
    ("segv", "it was killed by SIGSEGV", "SIGSEGV"),
])
def test_a_rank_that_dies_is_blamed_not_the_survivor(tmp_path, how, words, exc_type):
    pids = tmp_path / "pids"
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(exit_on_rank_one, args=(str(pids), how), nproc=2, timeout=60)
    err = info.value
    assert err.rank == 1 and err.exc_type == exc_type, str(err)
    assert str(err).startswith("rank 1 died without raising a Python exception: " + words)
    if how == "segv":
        assert "Segmentation fault" in err.remote_traceback  # faulthandler's report from stderr
    assert_all_gone(pids)


def start_child_and_return(path):
    child = subprocess.Popen(["sleep", "300"])
    with open(path, "a") as f:
        f.write(f"{dist.get_rank()} {child.pid} {os.getpid()}\n")
    return child.pid


def test_processes_started_by_a_rank_end_with_the_launch(tmp_path):
    pids = tmp_path / "pids"
    parlab.launch(start_child_and_return, args=(str(pids),), nproc=2)
    assert_all_gone(pids)


def detach_a_forked_sleeper():
    """Fork a grandchild in a session of its own (no exec: it keeps the rank's memory) and return its pid."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            time.sleep(300)
            os._exit(0)
        os.write(write, str(grandchild).encode())
        os._exit(0)
    os.waitpid(child, 0)
    return int(os.read(read, 32))


@pytest.mark.parametrize("fork_server", ["1", "0"])
def test_a_process_a_rank_forks_and_detaches_ends_with_the_launch(monkeypatch, fork_server):
    monkeypatch.setenv("PARLAB_FORK_SERVER", fork_server)
    left = parlab.launch(detach_a_forked_sleeper, nproc=2)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) and not _zombie(p) for p in left):
        time.sleep(0.1)
    assert not [p for p in left if alive(p) and not _zombie(p)], "a detached process outlived its launch"


def non_leaf_results():
    from collections import OrderedDict, namedtuple

    w = torch.ones(2, requires_grad=True)
    y = w * 2  # not a leaf: has a grad_fn
    pair = namedtuple("Pair", "a b")
    return OrderedDict(y=y), pair(y, 1)


def test_tensors_in_any_container_come_back_detached():
    (od, pair), _ = parlab.launch(non_leaf_results, nproc=2)
    assert type(od).__name__ == "OrderedDict" and not od["y"].requires_grad
    assert pair.a.tolist() == [2.0, 2.0] and not pair.a.requires_grad and pair.b == 1


def exit_zero():
    import sys
    sys.exit(0)


def test_sys_exit_zero_is_a_normal_end():
    assert parlab.launch(exit_zero, nproc=2) == [None, None]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_timeouts_must_be_finite_and_positive(bad):
    with pytest.raises(ValueError, match="positive, finite"):
        parlab.launch(whoami, args=(1.0,), nproc=2, timeout=bad)


def test_bad_parlab_timeout_environment_variable(monkeypatch):
    monkeypatch.setenv("PARLAB_TIMEOUT", "abc")
    with pytest.raises(ValueError, match="PARLAB_TIMEOUT must be a positive"):
        parlab.launch(whoami, args=(1.0,), nproc=2)


def test_timeout_during_start_up_says_so():
    with pytest.raises(parlab.LaunchTimeout) as info:
        parlab.launch(whoami, args=(1.0,), nproc=2, timeout=1.5)
    assert "had not finished starting" in str(info.value) and "debug=True" not in str(info.value)


def test_sweep_leaves_folders_it_does_not_understand(tmp_path, monkeypatch):
    monkeypatch.setattr(jobdir, "jobs_root", lambda: str(tmp_path))
    (tmp_path / "launch-x-y-z").mkdir()
    (tmp_path / "job-99999999-1-abc").mkdir()  # an older parlab's folder: its own code sweeps it
    (tmp_path / "launch-99999999-1.000-abc").mkdir()  # a dead owner: swept
    jobdir.sweep_stale_jobs()
    assert sorted(os.listdir(tmp_path)) == ["job-99999999-1-abc", "launch-x-y-z"]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to create a folder owned by someone else")
def test_a_jobs_folder_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "parlab-0"
    root.mkdir()
    os.chown(root, 12345, 12345)
    monkeypatch.setattr(jobdir, "jobs_root", lambda: str(root))
    with pytest.raises(parlab.LaunchError, match="not a folder owned by you"):
        parlab.launch(whoami, args=(1.0,), nproc=2)


def test_process_identity_is_pid_plus_start_time():
    from parlab.launch import procs

    token = procs.start_time(os.getpid())
    assert token and token == procs.start_time(os.getpid()) and procs.same_process(os.getpid(), token)
    assert not procs.same_process(os.getpid(), "1.000")  # same pid, another start: not ours
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while procs.start_time(zombie.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert procs.start_time(zombie.pid) is None  # exited, not yet reaped: a zombie counts as gone
    zombie.wait()
    assert procs.start_time(zombie.pid) is None and not procs.maybe_same_process(zombie.pid, None)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc, which only Linux has")
def test_process_identity_survives_a_wall_clock_step(monkeypatch):
    """A stepped wall clock (NTP, a paused VM) moves psutil's create_time: the token must not move."""
    import psutil

    from parlab.launch import procs

    token = procs.start_time(os.getpid())
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 32.6)
    assert procs.start_time(os.getpid()) == token and procs.same_process(os.getpid(), token)


def test_progress_bars_show_their_last_state(capsys):
    from parlab.launch.output import TextSink

    TextSink(1).line(0, "out", "".join(f"\r{i:3d}%" for i in range(101)))
    assert capsys.readouterr().out == "[rank 0] 100%\n"


def fails_in_shutdown():
    import atexit
    import os

    if dist.get_rank() == 0:
        atexit.register(os._exit, 3)  # after the result is written, as a crash in teardown would
    return dist.get_rank()


def test_a_rank_failing_after_its_result_is_written_loses_nothing(capfd):
    assert parlab.launch(fails_in_shutdown, nproc=2) == [0, 1]
    assert "rank 0: exit code 3" in capfd.readouterr().err
    assert_no_job_dirs()
