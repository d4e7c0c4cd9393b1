"""The kernel's fork server (parlab.launch.fork_server): when it serves a launch, and when it does not.

The drills every launch must pass (Ctrl-C, a killed kernel, a hang, eight
concurrent launches, a detached process) are in test_launcher.py and run
with the server, as a student's launches do; these tests pin down the
server's own rules.
"""
import os

import psutil
import pytest
import torch.distributed as dist

import parlab
from parlab.launch import fork_server

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


def lineage():
    """On a rank: (torchrun's agent, the agent's parent, the variable X, the world size).

    A forked rank's parent is the fork server multiprocessing starts for torchrun (its agent's child).
    """
    import multiprocessing

    agent = psutil.Process(os.getppid())
    if multiprocessing.parent_process() is not None:
        agent = agent.parent()
    return agent.pid, agent.ppid(), os.environ.get("PARLAB_TEST_X"), dist.get_world_size()


def test_ranks_are_forked_from_the_kernels_server_and_a_new_environment_replaces_it():
    fork_server.stop()
    first = parlab.launch(lineage, nproc=2)
    server = fork_server.server_pid()
    assert server is not None and {g for _, g, _, _ in first} == {server}
    assert len({p for p, _, _, _ in first}) == 1, "both ranks come from one torchrun"
    again = parlab.launch(lineage, nproc=3)
    assert fork_server.server_pid() == server and {g for _, g, _, _ in again} == {server}
    assert {p for p, _, _, _ in again}.isdisjoint({p for p, _, _, _ in first}), "a new torchrun per launch"
    changed = parlab.launch(lineage, nproc=2, env={"PARLAB_TEST_X": "1"})
    assert [x for _, _, x, _ in changed] == ["1", "1"]
    replaced = fork_server.server_pid()
    assert replaced not in (None, server) and {g for _, g, _, _ in changed} == {replaced}
    assert not psutil.pid_exists(server) or psutil.Process(server).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("why", ["switched off", "memory short"])
def test_without_the_server_the_launch_starts_cold(monkeypatch, why):
    fork_server.stop()
    if why == "switched off":
        monkeypatch.setenv("PARLAB_FORK_SERVER", "0")
    else:
        monkeypatch.setattr(fork_server, "memory_available", lambda: fork_server.MEMORY_NEEDED - 1)
    out = parlab.launch(lineage, nproc=2)
    assert fork_server.server_pid() is None
    assert {g for _, g, _, _ in out} == {os.getpid()}, "torchrun is the kernel's own child"
    assert ("off" in fork_server.describe()) and ("MiB" in fork_server.describe()) == (why == "memory short")


def rank_parent():
    """On a rank: its parent's command line, its thread count and its parent (torchrun's agent)."""
    parent = psutil.Process(os.getppid())
    return " ".join(parent.cmdline()), parent.num_threads(), parent.ppid()


def test_the_ranks_fork_server_is_a_one_thread_fork_of_the_agent():
    """Not a new interpreter that imports torch again (``-c from multiprocessing.forkserver import main``):
    the kernel's server's command line, one thread, the agent's child."""
    fork_server.stop()
    parlab.launch(lineage, nproc=2)
    out = parlab.launch(rank_parent, nproc=3)
    assert len({p for _, _, p in out}) == 1
    for cmdline, threads, _ in out:
        assert "parlab.launch.fork_server" in cmdline and "multiprocessing.forkserver" not in cmdline, cmdline
        assert threads == 1, threads


def test_the_server_ends_itself_when_idle(monkeypatch):
    fork_server.stop()
    monkeypatch.setenv(fork_server.IDLE_ENV, "0.5")
    parlab.launch(lineage, nproc=2, env={"PARLAB_TEST_X": "idle"})  # a server with this idle time
    server = fork_server._SERVER
    assert server is not None
    server.proc.wait(timeout=30)  # it checks every 5 s
    assert fork_server.server_pid() is None
    assert parlab.launch(lineage, nproc=2, env={"PARLAB_TEST_X": "idle"})[0][2] == "idle"  # a new one
    fork_server.stop()
