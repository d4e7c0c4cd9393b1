"""The record reader (parlab.grading.records) on records built by hand."""
from __future__ import annotations

import pytest

from parlab.grading import records
from parlab.grading.spy import Spy

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _call(op, in_backward=False, **facts):
    return {"op": op, "numel": 4, "dtype": "float32", "peer": None, "async": False,
            "in_backward": in_backward, "waited": False, "waited_in_backward": False, **facts}


def _event(kind, backward, calls, **facts):
    return {"event": kind, "backward": backward, "calls": calls, **facts}


def _record():
    """Two steps noted at their end, then a third step's forward: 5 calls, 3 backward passes."""
    return {"calls": [_call("all_reduce"), _call("all_reduce", True), _call("send", peer=1),
                      _call("recv", True, peer=1), _call("all_gather")],
            "events": [_event("forward", 0, 0), _event("step", 1, 2), _event("forward", 1, 2),
                       _event("compute", 1, 3, in_backward=True), _event("step", 2, 4),
                       _event("forward", 2, 4)],
            "backward": 3, "printed": "", "ddp": 0, "mutated": []}


def test_calls_by_op_and_pass():
    rec = _record()
    assert [c["op"] for c in records.calls(rec)] == ["all_reduce", "all_reduce", "send", "recv", "all_gather"]
    assert [c["op"] for c in records.calls(rec, backward=True)] == ["all_reduce", "recv"]
    assert [c["op"] for c in records.calls(rec, backward=False)] == ["all_reduce", "send", "all_gather"]
    assert [c["op"] for c in records.calls(rec, "send", "recv")] == ["send", "recv"]
    assert records.calls(rec, "all_reduce", backward=True) == [rec["calls"][1]]
    assert records.ops(rec, backward=False) == ["all_reduce", "send", "all_gather"]


def test_used_names_each_op_once_in_first_call_order():
    rec = _record()
    assert records.used(rec, "all_gather", "all_reduce", "broadcast") == ["all_reduce", "all_gather"]
    assert records.used(rec, "broadcast") == []


def test_events_of_a_kind_and_pass():
    rec = _record()
    assert records.events(rec, "forward") == [rec["events"][i] for i in (0, 2, 5)]
    assert records.events(rec, "compute", backward=True) == [rec["events"][3]]
    # an event without the in_backward fact is in neither pass
    assert records.events(rec, "forward", backward=False) == []
    assert records.event(rec, "step") is rec["events"][1]
    assert records.event(rec, "held") is None


def test_steps_closed_by_their_mark():
    rec = _record()
    first, second = records.steps(rec)
    assert first == {"events": rec["events"][0:2], "calls": rec["calls"][0:2], "backward": 1}
    assert second == {"events": rec["events"][2:5], "calls": rec["calls"][2:4], "backward": 1}


def test_steps_opened_by_their_mark():
    rec = _record()
    first, second = records.steps(rec, opens=True)
    assert first == {"events": rec["events"][1:4], "calls": rec["calls"][2:4], "backward": 1}
    # the last step runs to the record's end
    assert second == {"events": rec["events"][4:], "calls": rec["calls"][4:], "backward": 1}
    assert [len(p["events"]) for p in records.steps(rec, "forward", opens=True)] == [2, 3, 1]


def test_between_two_points():
    rec = _record()
    ev = rec["events"]
    assert records.between(rec, ev[2], ev[4]) == {"events": ev[2:4], "calls": rec["calls"][2:4],
                                                  "backward": 1}
    # a kind names its last event; None or a kind never noted: the record's beginning or end
    assert records.between(rec, "step")["calls"] == rec["calls"][4:]
    assert records.between(rec, "step")["events"] == ev[4:]
    assert records.between(rec, None, "step") == {"events": ev[:4], "calls": rec["calls"][:4],
                                                  "backward": 2}
    assert records.between(rec, "held", "never") == {"events": ev, "calls": rec["calls"],
                                                     "backward": 3}


def test_an_empty_record_has_no_steps():
    rec = Spy().record()
    assert records.steps(rec) == [] and records.steps(rec, opens=True) == []
    assert records.between(rec) == {"events": [], "calls": [], "backward": 0}


def test_a_real_spy_record_reads_the_same_way():
    spy = Spy()
    spy.note("step", loss=1.0)
    spy.note("step")
    rec = spy.record()
    assert [p["events"] for p in records.steps(rec)] == [[rec["events"][0]], [rec["events"][1]]]
    assert records.event(rec, "step")["loss"] == 1.0


def test_events_of_every_kind_in_one_pass():
    rec = _record()
    assert records.events(rec) == rec["events"]
    assert records.events(rec, backward=True) == [rec["events"][3]]
