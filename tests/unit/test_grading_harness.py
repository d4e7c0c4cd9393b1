"""The grading harness's parts that need no ranks: test-cell parsing, the
sandbox's refusals, the spy in one process, rule and summary messages."""
from __future__ import annotations

import json

import pytest
import torch

from parlab import check
from parlab.grading import harness
from parlab.grading.autograde import graded_calls
from parlab.grading.autograde.sandbox import grade_request
from parlab.grading.spy import Spy

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_graded_calls_reads_visible_and_hidden_checks():
    source = ("from parlab.grading import lab01\n"
              "lab01.check_ring_allreduce(ring_all_reduce)\n"
              "### BEGIN HIDDEN TESTS\n"
              "lab01.check_ring_allreduce(ring_all_reduce, hidden=True)\n"
              "### END HIDDEN TESTS\n")
    calls = graded_calls(source)
    assert [(c["lab"], c["check"], c["answer"], c["hidden"]) for c in calls] == [
        ("lab01", "check_ring_allreduce", "ring_all_reduce", False),
        ("lab01", "check_ring_allreduce", "ring_all_reduce", True)]


@pytest.mark.parametrize("source", ["print('hi')", "x = (", "other.check_x(f)", "lab01.helper(f)",
                                    "lab01.check_x()"])
def test_graded_calls_ignores_everything_else(source):
    assert graded_calls(source) == []


@pytest.mark.parametrize("lab,check_name", [("os", "check_x"), ("lab01", "system"),
                                            ("lab99", "check_x"), ("lab01", "check_nothing")])
def test_sandbox_refuses_unknown_checks(tmp_path, lab, check_name):
    verdict = grade_request({"lab": lab, "check": check_name, "hidden": False, "name": "f",
                             "payload": str(tmp_path / "none"), "verdict": str(tmp_path / "v")})
    assert verdict == {"passed": False, "message": f"unknown check {lab}.{check_name}"}
    json.dumps(verdict)


def test_spy_counts_outermost_backward_prints_and_mutation(capsys):
    spy = Spy()
    x = torch.ones(3)
    spy.guard(x=x)
    w = torch.ones(3, requires_grad=True)
    with spy.watch():
        for _ in range(2):
            (w * 2).sum().backward()  # Tensor.backward calls torch.autograd.backward: one pass
        print("hello")
        x.add_(1)
    (w * 2).sum().backward()  # outside watch(): not counted
    record = spy.record()
    assert record["backward"] == 2
    assert record["printed"] == "hello\n" and "hello" in capsys.readouterr().out
    assert record["mutated"] == ["x"] and record["calls"] == [] and record["ddp"] == 0


def test_spy_leaves_torch_as_it_found_it():
    from torch._C import _distributed_c10d as c10d

    def state():
        return (torch.Tensor.backward, torch.autograd.backward, torch.distributed.all_reduce,
                dict(vars(c10d.ProcessGroup)), dict(vars(c10d.Backend)),
                torch.ops.c10d.allreduce_, torch.ops._c10d_functional.all_reduce)

    before = state()
    with Spy().watch():
        assert state() != before  # it did patch them
    assert state() == before


def test_spy_records_collectives_reached_around_dist(tmp_path):
    """A default group's method, a Backend's, torch.ops.c10d and the functional collectives:
    each recorded under the dist function it stands for, with how it was called."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from parlab.grading.records import call_name

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        spy, t = Spy(), torch.ones(3)
        group = dist.distributed_c10d._get_default_group()
        with spy.watch():
            group.allreduce([t]).wait()
            group._get_backend(torch.device("cpu")).broadcast([t]).wait()
            funcol.wait_tensor(funcol.all_reduce(t, "sum", group))
            dist.all_reduce(t)  # once, not once per layer it passes through
        calls = spy.record()["calls"]
        assert [(c["op"], c.get("via")) for c in calls] == [
            ("all_reduce", "ProcessGroup.allreduce"), ("broadcast", "Backend.broadcast"),
            ("all_reduce", "torch.ops._c10d_functional.all_reduce"), ("all_reduce", None)]
        assert call_name(spy.record(), "broadcast") == "Backend.broadcast (what dist.broadcast runs)"
        from torch.distributed import all_reduce  # bound before watch(): never the patched dist.all_reduce
        spy = Spy()
        with spy.watch():
            all_reduce(t)
        assert [(c["op"], c.get("via")) for c in spy.record()["calls"]] == [("all_reduce", "ProcessGroup.allreduce")]
        group.allreduce([t]).wait()  # the class's methods still bind self after watch()
    finally:
        dist.destroy_process_group()


def _ex(**kw):
    base = dict(key="labxx.demo", answer="demo", run=None, grade=lambda g: None,
                visible=((4, (1, 2)),), hidden=((3, (1,)), (2, (1, 2, 3))))
    base.update(kw)
    return harness.Exercise(**base)


def test_summary_grammar():
    ex = _ex()
    assert harness.summary(ex, "demo", False) == "demo: 2 visible cases passed on 4 ranks"
    assert harness.summary(ex, "demo", True) == "demo: 4 hidden cases passed on 2 and 3 ranks"
    solo = _ex(visible=((1, (1,)),), solo=True)
    assert harness.summary(solo, "demo", False) == "demo: 1 visible case passed"


def test_rule_message_quotes_the_notebook():
    rule = harness.Rule("Do not touch x.", lambda recs, case, n: "rank 1 touched x." if n else None)
    graded = harness.Graded("demo", 2, [1], [[None], [None]], records=[[{}], [{}]])
    msg = harness.rules_message(_ex(rules=(rule,)), graded)
    assert msg.endswith('but rank 1 touched x.\nThe exercise says: "Do not touch x."'), msg


def test_hint_helpers_never_crash_on_odd_results():
    exp = {"w": torch.ones(2), "b": torch.ones(1)}
    for got in ({}, {"w": None, "b": None}, {"w": "text"}, {"w": torch.ones(3)}):
        assert check.grad_scale(got, exp) is None
        check.named_differ(got, exp)
    assert check.grad_scale({"w": 2 * torch.ones(2), "b": 2 * torch.ones(1)}, exp) == pytest.approx(2)
    assert not check.same_values(None, torch.ones(1)) and not check.same_values([1.0], torch.ones(1))


def test_tolerances_follow_the_backend():
    exp = torch.ones(4)
    noisy = exp + 5e-5  # NCCL-sized reduction noise for float32
    check.assert_close(noisy, exp, backend="nccl")
    with pytest.raises(AssertionError):
        check.assert_close(noisy, exp, backend="gloo")
    with pytest.raises(AssertionError):
        check.assert_close(noisy, exp)  # gloo by default
    with check.judged_on("cpu:gloo,cuda:nccl"):
        assert check.same_values(noisy, exp)
    with pytest.raises(ValueError, match="unknown backend"):
        check.assert_close(exp, exp, backend="carrier-pigeon")


# ------------------------------------------------------------ diagnosis: a hint only from evidence
def test_diagnose_names_the_one_mistake_that_fits_every_piece():
    from parlab.grading.diagnosis import diagnose

    assert diagnose([{"bits": "8x"}, {"bits": "8x", "gb": "GB"}]) == "8x"
    # two mistakes fit every piece: neither is named
    assert diagnose([{"a": "A", "b": "B"}, {"a": "A", "b": "B"}]) == ""
    # a piece the answer got right rules a mistake out
    assert diagnose([{"a": "A", "b": "B"}], right=[["a"]]) == "B"
    # one piece that fits nothing: nothing is named
    assert diagnose([{"a": "A"}, {}]) == ""
    assert diagnose([]) == ""


def test_numbers_message_names_a_mistake_only_when_every_case_shows_it():
    from parlab.grading.numbers import numbers_message

    def rows(got_of):
        return [(got_of(n), 16 * n, f"f({n})", [(12 * n, "optimizer only"), (8 * n, "no moments"),
                                                 (8 * n * (n > 1), "moments only on big n")])
                for n in (1, 2)]
    assert numbers_message(rows(lambda n: 12 * n)).endswith("optimizer only")
    # 8n fits "no moments" on both cases; "moments only on big n" gives 0 on n = 1: ruled out there
    assert numbers_message(rows(lambda n: 8 * n)).endswith("no moments")
    # right on n = 1, wrong on n = 2: a mistake that is wrong on n = 1 is ruled out, none is named
    message = numbers_message(rows(lambda n: 16 if n == 1 else 24))
    assert message.startswith("f(2) returned 24") and "Yours is 0.75 times" in message
    # two mistakes give one value: the message says what differs and names neither
    both = [(12.0, 16.0, "g()", [(12.0, "A", "a"), (12.0, "B", "b")])]
    assert "A" not in numbers_message(both).split("expected")[1] and "0.75 times" in numbers_message(both)
    assert numbers_message(both, differs=lambda got, want, i: f"{got:g} of {want:g}").endswith("12 of 16")


def test_a_call_is_named_from_the_record():
    from parlab.grading.records import describe

    record = {"calls": [{"op": "all_gather", "numel": 1, "dtype": "int64", "peer": None, "in_backward": False},
                        {"op": "send", "numel": 24, "dtype": "float32", "peer": 3, "in_backward": True,
                         "group_size": 2}]}
    assert describe(record, record["calls"][0]) == "dist.all_gather of 1 int64 elements (call 1 of 2)"
    assert describe(record, record["calls"][1]) == ("dist.send of 24 float32 elements with rank 3 on a group of "
                                                    "2 ranks during backward (call 2 of 2)")
    via = {"op": "all_reduce", "numel": 4, "dtype": "float32", "peer": None, "in_backward": False,
           "via": "ProcessGroup.allreduce"}
    assert describe({"calls": [via]}, via).startswith("ProcessGroup.allreduce (what dist.all_reduce runs) of 4")


def test_which_term_isolates_the_term_by_doubling_one_input_at_a_time():
    from parlab.grading.diagnosis import Term, which_term

    x, y = Term("x", "the x term", 0), Term("y", "the y term", 1)

    def want(a, b):
        return 3 * a + 5 * b * b

    def changes(answer, args=(2.0, 1.0)):
        return answer(*args), want(*args), [(t, answer(*t.vary(args)), want(*t.vary(args))) for t in (x, y)]

    got, wanted, seen = changes(lambda a, b: 3 * a)  # the y term left out
    assert which_term(got, wanted, seen).startswith("Your answer does not change when y doubles")
    got, wanted, seen = changes(lambda a, b: 3 * a + 5 * b)  # the y term wrong
    assert "the term that is wrong is the y term" in which_term(got, wanted, seen)
    got, wanted, seen = changes(lambda a, b: 3 * a + 5 * b * b + 1)  # a constant
    assert "the part that none of them changes is off, by 1" in which_term(got, wanted, seen)

    def product(a, b):
        return 4 * a * b

    def ring(a, b):  # a factor of b written upside down: every input's change is off, b's factor alone
        return 4 * a / b

    args = (2.0, 4.0)
    seen = [(t, ring(*t.vary(args)), product(*t.vary(args))) for t in (x, y)]
    assert "When y doubles, your answer grows 0.5 times, not 2 times" in which_term(ring(*args), product(*args), seen)

    # two inputs of one factor written upside down (time = work / (peak · mfu) as work · peak · mfu)
    z, w = Term("peak", "the division by peak × MFU", 1), Term("mfu", "the division by peak × MFU", 2)

    def time(a, b, c):
        return a / (b * c)

    def backwards(a, b, c):
        return a * b * c

    args = (8.0, 2.0, 0.5)
    seen = [(t, backwards(*t.vary(args)), time(*t.vary(args))) for t in (x, z, w)]
    said = which_term(backwards(*args), time(*args), seen)
    assert "Doubling peak and mfu" in said and "the term that is wrong is the division by peak × MFU" in said
    assert "x" not in said.split(":")[0]
