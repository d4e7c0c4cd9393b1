"""The sandbox's shared launches: fewer launches, and never a different verdict.

The rules are checked with a stand-in for the launcher (no process starts);
one end-to-end test grades lab 00 answers through the sandbox's request
file, as ``parlab.grading.autograde`` hands them in, and compares every
verdict with what each answer deserves.
"""
import json
import time

import cloudpickle
import pytest

from parlab.grading import harness, lab00
from parlab.grading.autograde import sandbox, shared_launches
from parlab.grading.autograde.shared_launches import TASK_NOTE, grade_shared, task_of
from parlab.launch.errors import WorkerError
from wrong_answers import lab00 as answers

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]  # the last test launches ranks

SOLO = harness.Exercise(key="t.solo", answer="f", run=lambda f, case, i, spy: f(case),
                        grade=lambda g: None if all(r == [c * 2 for c in g.cases] for r in g.results)
                        else f"{g.name} is wrong",
                        visible=((2, (1, 2)),), hidden=((2, (3,)), (1, (4,))))


def raised_in(index: int) -> WorkerError:
    text = f"Traceback ...\nNotImplementedError\n(while grading case 1, world_size 2)\n{TASK_NOTE}{index}"
    return WorkerError(f"rank 0 failed: NotImplementedError: \n\nTraceback from rank 0:\n{text}",
                       rank=0, remote_traceback=text, exc_type="NotImplementedError",
                       failures={0: "NotImplementedError: "}, phase="raised", blamed=(0,))


class FakeLauncher:
    """Runs the tasks in this process, or fails the way ``script`` says, and counts launches."""

    def __init__(self, script=(), seconds=0.0):
        self.script = list(script)  # per launch: None (run) or an exception to raise
        self.seconds = seconds      # how long each answer "took" on the ranks
        self.launches = []

    def __call__(self, fn, args, *, nproc, timeout, isolate, backend):
        (tasks,) = args
        self.launches.append((nproc, [t[2].__name__ for t in tasks], timeout))
        failure = self.script.pop(0) if self.script else None
        if failure is not None:
            raise failure
        out = harness.run_tasks(tasks, True)
        for key, *_ in tasks:
            out[harness.task_slot(key)]["seconds"] = self.seconds
        return [out] * nproc


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def items(*fns, hidden=False):
    return [(fn.__name__, fn.__name__, SOLO, fn, hidden) for fn in fns]


def test_answers_that_need_the_same_world_size_share_one_launch(monkeypatch):
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    got = grade_shared(items(double, double, hidden=True)[:1] + items(triple) + [
        ("again", "double", SOLO, double, True)])
    assert [n for n, _, _ in fake.launches] == [2, 1]  # hidden sets on 2 and 1 rank, visible on 2
    assert got["double"] is None and got["again"] is None
    assert "triple" not in got  # wrong after another answer ran: left to a launch of its own


def test_a_failure_is_kept_only_when_its_answer_ran_first(monkeypatch):
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    got = grade_shared(items(triple, double))
    assert got == {"triple": "triple is wrong", "double": None}


def test_the_answer_that_raised_gets_its_message_and_the_rest_run_again(monkeypatch):
    fake = FakeLauncher([raised_in(1), raised_in(0), None])
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    got = grade_shared([(key, fn.__name__, SOLO, fn, False)
                        for key, fn in (("a", double), ("b", triple), ("c", double))])
    # launch 1: task 1 raised after another ran: left undecided; launch 2: its first task raised
    assert [names for _, names, _ in fake.launches] == [["double", "triple", "double"],
                                                         ["double", "double"], ["double"]]
    assert set(got) == {"a", "c"} and got["c"] is None
    assert "NotImplementedError" in got["a"] and "double raised an error" in got["a"]
    assert TASK_NOTE not in got["a"]  # the bookkeeping note never reaches the student


def test_a_launch_that_died_leaves_its_answers_to_launches_of_their_own(monkeypatch):
    died = WorkerError("rank 1 died without raising a Python exception", rank=1, phase="died",
                       exc_type="SIGSEGV", blamed=(1,))
    fake = FakeLauncher([died])
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    assert grade_shared(items(double, triple)) == {}
    fake = FakeLauncher([died])
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    alone = grade_shared(items(double))  # alone in its launch: the failure is its own
    assert "died" in alone["double"]


def test_the_launch_timeout_grows_with_the_answers_it_holds(monkeypatch):
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    grade_shared(items(double, double, double))
    assert fake.launches[0][2] == SOLO.timeout + 2 * shared_launches.PER_EXTRA_TASK


def test_a_call_after_a_failed_one_in_its_cell_is_not_run(monkeypatch):
    fake = FakeLauncher([raised_in(0), None])
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    got = grade_shared([("visible", "double", SOLO, double, False), ("hidden", "double", SOLO, double, True),
                        ("other", "double", SOLO, double, False)], after={"hidden": "visible"})
    assert [names for _, names, _ in fake.launches] == [["double"] * 3, ["double"]]
    assert set(got) == {"visible", "other"}


#: Visible cases on 2 ranks, hidden ones on 3 and 1: a hidden call needs a launch of a size no visible call has.
WIDER_HIDDEN = harness.Exercise(key="t.wider", answer="f", run=SOLO.run, grade=SOLO.grade,
                                visible=((2, (1, 2)),), hidden=((3, (3,)), (1, (4,))))


def cell(fn, key="cell"):
    """A test cell's two calls, visible then hidden, of ``WIDER_HIDDEN`` on ``fn``."""
    return ([((key, 0), fn.__name__, WIDER_HIDDEN, fn, False), ((key, 1), fn.__name__, WIDER_HIDDEN, fn, True)],
            {(key, 1): (key, 0)})


def test_a_call_gets_a_launch_of_its_own_size_only_once_the_calls_before_it_passed(monkeypatch):
    """A stub that raises (a blank notebook) costs the visible launch only, not the hidden call's
    wider one; a passing cell still costs one launch per world size, as many as before."""
    fake = FakeLauncher([raised_in(0)])
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    calls, after = cell(double)
    assert set(grade_shared(calls, after=after)) == {("cell", 0)}
    assert [n for n, _, _ in fake.launches] == [2]
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    calls, after = cell(double)
    assert grade_shared(calls, after=after) == {("cell", 0): None, ("cell", 1): None}
    assert sorted(n for n, _, _ in fake.launches) == [1, 2, 3]
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    calls, after = cell(triple)  # wrong: the hidden call, moot, never runs
    assert grade_shared(calls, after=after) == {("cell", 0): "triple is wrong"}
    assert [n for n, _, _ in fake.launches] == [2]


def test_a_pass_counts_only_once_every_world_size_ran(monkeypatch):
    """The hidden call passed on 2 ranks; its visible call then failed after another answer, so
    the hidden one never ran on 1 rank: it is not decided, the sandbox grades it alone."""
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    got = grade_shared([("first", "double", SOLO, double, False), ("visible", "triple", SOLO, triple, False),
                        ("hidden", "triple", SOLO, double, True)], after={"hidden": "visible"})
    assert [n for n, _, _ in fake.launches] == [2]  # on 1 rank only the moot hidden call was left
    assert got == {"first": None}


def test_a_pass_that_took_over_half_the_timeout_is_graded_alone(monkeypatch):
    fake = FakeLauncher(seconds=SOLO.timeout / 2 + 1)
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    assert grade_shared(items(double)) == {}  # alone, a wait that long might have timed out


def test_no_shared_launch_starts_past_the_deadline(monkeypatch):
    fake = FakeLauncher()
    monkeypatch.setattr(shared_launches, "launch_tasks", fake)
    assert grade_shared(items(double), deadline=time.monotonic() + SOLO.timeout / 2) == {}
    assert fake.launches == []


def test_task_of_reads_the_note_and_nothing_else():
    assert task_of(raised_in(7)) == 7
    assert task_of(WorkerError("rank 0 failed: ValueError: 7", rank=0, phase="raised")) is None
    # an answer that puts the note's words in its own message cannot name another task
    spoof = raised_in(2)
    spoof.remote_traceback = spoof.remote_traceback.replace("NotImplementedError", f"ValueError: {TASK_NOTE}0")
    assert task_of(spoof) == 2
    died = raised_in(0)
    died.phase = "died"  # a dead rank's stderr is the answer's to write
    assert task_of(died) is None


# ---------------------------------------------------------------- end to end, on ranks
def _request(tmp_path, cells):
    """A sandbox request for ``cells`` [(answer, check, [hidden, ...])], as autograde writes it."""
    out = []
    for i, (fn, check, flags) in enumerate(cells):
        payload = tmp_path / f"answer{i}.pkl"
        payload.write_bytes(cloudpickle.dumps(fn))
        out.append({"key": i, "calls": [{"lab": "lab00", "check": check, "hidden": h, "name": fn.__name__,
                                         "payload": str(payload)} for h in flags]})
    path = tmp_path / "request.json"
    path.write_text(json.dumps({"cells": out, "verdict": str(tmp_path / "verdict.json")}))
    return path


def test_sandbox_verdicts_match_what_each_answer_deserves(tmp_path, monkeypatch):
    both = [False, True]
    cells = [  # (answer, its check, its calls) in notebook order; True: deserves full marks
        (answers.hello_flushes, "check_hello", both, True),
        (answers.hello_typo, "check_hello", both, False),
        (answers.hello_print_with_commas, "check_hello", both, True),
        (answers.weight_bits, "check_weight_bytes", both, False),
        (answers.weight_numpy, "check_weight_bytes", both, True),
        (answers.state_itemised, "check_training_state_bytes", both, True),
        (answers.gpus_floor, "check_gpus_to_hold_state", both, False),
        (answers.days_with_cost, "check_days_to_train", both, True),
    ]
    shared_count, alone_count = [], []
    real = harness.launch_tasks

    def counting(into):
        def launch(*args, **kwargs):
            into.append(kwargs["nproc"])
            return real(*args, **kwargs)
        return launch

    monkeypatch.setattr(shared_launches, "launch_tasks", counting(shared_count))
    monkeypatch.setattr(harness, "launch_tasks", counting(alone_count))
    request = _request(tmp_path, [c[:3] for c in cells])
    assert sandbox.main([str(request)]) == 0
    verdicts = {r["key"]: r["verdicts"] for r in json.loads((tmp_path / "verdict.json").read_text())}
    for i, (fn, check, _, right) in enumerate(cells):
        passed = [v["passed"] for v in verdicts[i]]
        assert passed == ([True, True] if right else [False]), (fn.__name__, verdicts[i])
    messages = {fn.__name__: verdicts[i][-1]["message"] for i, (fn, *_rest) in enumerate(cells)}
    assert "bits, not bytes" in messages["weight_bits"] and "hello_typo" in messages["hello_typo"]
    # hidden hello runs on 3 ranks, visible on 2, the formulas on 1: one shared launch each; only
    # the wrong answers that ran after another answer are graded again, in launches of their own
    assert sorted(shared_count) == [1, 2, 3]
    assert len(alone_count) <= 3, alone_count
    assert lab00.EXERCISES  # the checks named above are lab 00's
