"""Launch options (``parlab.launch.options.LaunchOptions``): one home, checked once, one message.

Every bad value is refused before anything starts, with the same sentence from
every entry that takes it: ``parlab.launch``, ``parlab.run_script``,
``parlab.start``, ``%%torchrun`` and ``%parlab start``.  What is built is
passed down as it is: neither ``Job`` nor ``WarmGroup`` checks it again.
No test here starts a process.
"""
import dataclasses
import inspect
import os

import numpy as np
import pytest

import parlab
from parlab.launch import magic, options, warm
from parlab.launch.job import Job
from parlab.launch.jobdir import jobs_root
from parlab.launch.options import LaunchOptions
from parlab.launch.tasks import CallTask

pytestmark = pytest.mark.unit


def one():
    return 1


#: (options, exception, the message's start): what every entry must say.
BAD = [
    ({"nproc": 0}, ValueError, "nproc must be at least 1, got 0"),
    ({"nproc": "2"}, TypeError, "nproc must be a whole number of ranks, got '2'"),
    ({"nproc": True}, TypeError, "nproc must be a whole number of ranks, got True"),
    ({"nproc": 2.0}, TypeError, "nproc must be a whole number of ranks, got 2.0"),
    ({"backend": "tcp"}, ValueError, "unknown backend 'tcp': choose one of gloo, nccl, mpi"),
    ({"timeout": -1}, ValueError, "timeout must be a positive, finite number of seconds, got -1"),
    ({"timeout": float("inf")}, ValueError, "timeout must be a positive, finite number of seconds, got inf"),
    ({"timeout": "60"}, ValueError, "timeout must be a positive, finite number of seconds, got '60'"),
    ({"timeout": True}, ValueError, "timeout must be a positive, finite number of seconds, got True"),
    ({"env": {"A": 1}}, TypeError, "env keys and values must be strings; not so for ['A']"),
    ({"env": [("A", "1")]}, TypeError, "env must be a dict of environment variables, got list"),
    ({"debug": "yes"}, TypeError, "debug must be True, False or None (None: PARLAB_DEBUG decides), got 'yes'"),
    ({"seed": 1.5}, TypeError, "seed must be a whole number, got 1.5"),
    ({"seed": "3"}, TypeError, "seed must be a whole number, got '3'"),
    ({"seed": True}, TypeError, "seed must be a whole number, got True"),
    ({"seed": -1}, ValueError, "seed must be at least 0, got -1"),
    ({"seed": 2 ** 32 - 1}, ValueError, "seed must be at most 4294967294 for 2 rank(s), got 4294967295: rank r "
                                        "is seeded with seed + r, and numpy takes seeds from 0 to 2**32 - 1"),
]
#: Options only a cold launch takes (a warm group is local, on one node, with the launcher's results).
BAD_COLD = [
    ({"nnodes": 0}, ValueError, "nnodes must be at least 1, got 0"),
    ({"nnodes": 3}, ValueError, "nproc=2 must split evenly over nnodes=3"),
    ({"gpus": 2}, ValueError, "gpus ask(s) Slurm for resources: pass scheduler='slurm' too"),
    ({"partition": "gpu", "time_limit": 5}, ValueError,
     "partition, time_limit ask(s) Slurm for resources: pass scheduler='slurm' too"),
    ({"scheduler": "pbs"}, ValueError, "scheduler must be one of local, slurm, got 'pbs'"),
]


@pytest.fixture
def nothing_starts(monkeypatch):
    """No job folder may appear, and Job.run (which starts processes) must never be reached."""
    monkeypatch.delenv("PARLAB_TIMEOUT", raising=False)
    monkeypatch.delenv("PARLAB_DEBUG", raising=False)
    monkeypatch.setattr(options, "_visible_gpus", lambda: 0)

    def refuse(*_):
        raise AssertionError("a launch started although its options were bad")

    monkeypatch.setattr(Job, "run", refuse)
    monkeypatch.setattr(warm.WarmGroup, "_boot", refuse)
    before = set(os.listdir(jobs_root())) if os.path.isdir(jobs_root()) else set()
    yield
    after = set(os.listdir(jobs_root())) if os.path.isdir(jobs_root()) else set()
    assert after <= before, "a job folder was made"


def refusals(entries, kw) -> list[tuple[str, type, str]]:
    """(entry, exception type, message) of each entry called with ``kw`` (nproc=2 unless given)."""
    kw = {"nproc": 2, **kw}
    seen = []
    for name, entry in entries.items():
        try:
            entry(**kw)
        except (TypeError, ValueError, parlab.LaunchError) as exc:
            seen.append((name, type(exc), str(exc)))
        else:
            seen.append((name, None, "accepted"))
    return seen


COLD = {"LaunchOptions": lambda **kw: LaunchOptions(**kw), "launch": lambda **kw: parlab.launch(one, **kw),
        "run_script": lambda **kw: parlab.run_script(__file__, **kw),  # any file that exists
        "run_cell": lambda **kw: parlab.launch.run_cell("1", {}, **kw)}
WARM = {"start": lambda **kw: parlab.start(**kw)}


@pytest.mark.parametrize("kw, kind, message", BAD, ids=[repr(b[0]) for b in BAD])
def test_a_bad_value_gets_the_same_message_from_every_entry(nothing_starts, kw, kind, message):
    seen = refusals({**COLD, **WARM}, kw)
    assert {(k, m) for _, k, m in seen} == {(kind, seen[0][2])}, seen  # one type, one sentence
    assert seen[0][2].startswith(message), seen[0][2]


@pytest.mark.parametrize("kw, kind, message", BAD_COLD, ids=[repr(b[0]) for b in BAD_COLD])
def test_a_bad_cold_option_gets_the_same_message_from_every_cold_entry(nothing_starts, kw, kind, message):
    seen = refusals(COLD, kw)
    assert {(k, m) for _, k, m in seen} == {(kind, seen[0][2])}, seen
    assert seen[0][2].startswith(message), seen[0][2]


def test_plain_results_is_checked_the_same_by_launch_and_the_options(nothing_starts):
    seen = refusals({"LaunchOptions": COLD["LaunchOptions"], "launch": COLD["launch"]}, {"plain_results": "yes"})
    assert {(k, m) for _, k, m in seen} == {(TypeError, "plain_results must be True or False, got 'yes'")}, seen


def test_environment_defaults_are_read_and_checked_the_same_way(nothing_starts, monkeypatch):
    monkeypatch.setenv("PARLAB_TIMEOUT", "soon")
    seen = refusals({**COLD, **WARM}, {})
    assert {m for _, _, m in seen} == {"PARLAB_TIMEOUT must be a positive, finite number of seconds, "
                                       "got 'soon'"}, seen
    monkeypatch.setenv("PARLAB_TIMEOUT", "7.5")
    monkeypatch.setenv("PARLAB_DEBUG", "1")
    opts = LaunchOptions(nproc=2)
    assert (opts.timeout, opts.debug) == (7.5, True)
    monkeypatch.setenv("PARLAB_DEBUG", "0")
    assert LaunchOptions(nproc=2, timeout=3).debug is False and LaunchOptions(nproc=2, timeout=3).timeout == 3.0


def test_nccl_without_gpus_is_the_same_launch_error_from_every_entry(nothing_starts):
    seen = refusals({**COLD, **WARM}, {"backend": "nccl"})
    assert {(k, m) for _, k, m in seen} == {(parlab.LaunchError, "backend='nccl' needs GPUs, but this machine "
                                             "has none visible (torch.cuda.is_available() is False). Use "
                                             "backend='gloo' to run on CPU.")}, seen


def test_the_magics_refuse_with_the_same_messages(nothing_starts):
    lines = {"-n 0": "nproc must be at least 1, got 0", "--backend tcp": "unknown backend 'tcp'",
             "--timeout -1": "timeout must be a positive, finite number of seconds, got -1.0",
             "--seed -1": "seed must be at least 0, got -1"}
    for line, message in lines.items():
        for run in (lambda: magic.torchrun(f"-n 2 {line}", "1"), lambda: magic.parlab_line(f"start -n 2 {line}")):
            with pytest.raises(ValueError) as info:
                run()
            assert str(info.value).startswith(message), (line, str(info.value))
    with pytest.raises(ValueError, match=r"^%parlab start: unknown option\(s\) --gpus 2\. Usage"):
        magic.parlab_line("start -n 2 --gpus 2")  # a warm group is local: not silently ignored
    with pytest.raises(ValueError, match=r"^%%torchrun: argument --seed: invalid int value: '1\.5'"):
        magic.torchrun("--seed 1.5", "1")


def test_good_values_are_filled_in_and_the_result_is_frozen(monkeypatch):
    monkeypatch.delenv("PARLAB_TIMEOUT", raising=False)
    monkeypatch.delenv("PARLAB_DEBUG", raising=False)
    monkeypatch.setattr(options, "_visible_gpus", lambda: 0)
    env = {"A": "1"}
    opts = LaunchOptions(np.int64(3), "GLOO", 30, env, None, np.int64(7))
    assert (opts.nproc, opts.backend, opts.timeout, opts.debug, opts.seed) == (3, "gloo", 30.0, False, 7)
    assert type(opts.nproc) is int and type(opts.seed) is int and type(opts.timeout) is float
    assert (opts.scheduler, opts.nnodes, opts.request, opts.plain_results) == ("local", 1, None, False)
    env["A"] = "changed"
    assert dict(opts.env) == {"A": "1"}  # a copy, read-only
    with pytest.raises(TypeError):
        opts.env["B"] = "2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.seed = 8
    defaults = LaunchOptions()
    assert (defaults.nproc, defaults.backend, defaults.timeout, defaults.seed) == \
        (2, "gloo", options.DEFAULT_TIMEOUT, 0)
    assert LaunchOptions(nproc=2, seed=2 ** 32 - 2).seed == 2 ** 32 - 2  # rank 1: 2**32 - 1, the largest
    assert dataclasses.replace(opts, timeout=5) == LaunchOptions(3, "gloo", 5, {"A": "1"}, False, 7)
    assert opts.with_timeout(None) == 30.0 and opts.with_timeout(2) == 2.0
    with pytest.raises(ValueError, match="timeout must be a positive, finite number of seconds, got 0"):
        opts.with_timeout(0)


def test_what_is_built_is_passed_down_unchecked(monkeypatch):
    monkeypatch.setattr(options, "_visible_gpus", lambda: 0)
    cold = LaunchOptions(nproc=3, timeout=9, env={"A": "1"}, debug=True, seed=4, plain_results=True)
    warm_opts = dataclasses.replace(cold, plain_results=False)

    def checked_again(*_):
        raise AssertionError("checked twice")

    for name in ("choose_backend", "check_timeout", "check_env", "check_debug", "check_seed", "check_flag"):
        monkeypatch.setattr(options, name, checked_again)
    job = Job(CallTask(one, (), {}), cold)
    assert job.options is cold
    assert (job.nproc, job.backend, job.timeout, job.debug, job.seed, job.plain_results, job.extra_env) == \
        (3, "gloo", 9.0, True, 4, True, {"A": "1"})
    group = warm.WarmGroup(warm_opts)
    assert group.options is warm_opts and (group.nproc, group.backend, group.timeout) == (3, "gloo", 9.0)


def test_a_warm_group_refuses_what_only_a_cold_launch_can_do(monkeypatch):
    monkeypatch.setattr(options, "_visible_gpus", lambda: 0)
    for kw in ({"nnodes": 2}, {"plain_results": True}):
        with pytest.raises(ValueError, match="a warm group runs on this machine's own ranks, on one node"):
            warm.WarmGroup(LaunchOptions(nproc=2, **kw))
    group = warm.WarmGroup(LaunchOptions(nproc=2, seed=5))
    assert (group.nproc, group.backend, group.options.seed, group.job) == (2, "gloo", 5, None)


def test_every_entry_restates_the_options_defaults_unchanged():
    fields = {f.name: f.default for f in dataclasses.fields(LaunchOptions) if f.init and f.name != "_"}
    for entry in (parlab.launch.launch, parlab.run_script, parlab.launch.run_cell, parlab.start):
        params = inspect.signature(entry).parameters
        shared = {name: p.default for name, p in params.items() if name in fields}
        assert shared == {name: fields[name] for name in shared}, entry.__name__
    assert set(inspect.signature(parlab.launch.launch).parameters) >= set(fields)
    assert set(inspect.signature(parlab.start).parameters) == {"nproc", "backend", "timeout", "env", "debug", "seed"}
    flags = {dest for _, dest, _ in magic._FLAGS}
    assert flags == set(fields) - {"env", "plain_results"}  # every option a line can carry has a flag
    assert set(magic._WARM_FLAGS) <= set(inspect.signature(parlab.start).parameters)
