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
