"""Reading a rank's spy record: the one reader every lab's rules use.

``Spy.record()`` (``parlab.grading.spy``) gives one rank's record of one
case as plain data::

    {"calls":   [{"op": "all_reduce", "numel": 12, "dtype": "float32",
                  "peer": None,            # send/recv: the global rank of the peer
                  "async": False,          # async_op=True, or isend/irecv
                  "in_backward": False,    # made during a backward pass
                  "waited": False,         # its work was waited on (or its future taken)
                  "waited_in_backward": False,
                  "group_size": 2}, ...],  # only when group= was passed: its ranks; in call order
     "events":  [{"event": "step",         # what the grader's code noted (``spy.note``)
                  "backward": 2,           # backward passes begun before it
                  "calls": 5,              # dist calls made before it
                  ...facts}, ...],         # in the order they were noted
     "backward": 3,                        # outermost backward passes run
     "printed": "...", "ddp": 0, "mutated": ["x"]}

Events noted inside a backward pass may carry ``"in_backward"`` among their
facts (lab 07's recorder notes it); ``events(..., backward=...)`` filters
on it.  An event's ``calls`` and ``backward`` counts place it among the
calls, which is how ``between`` and ``steps`` cut a record into pieces:
a piece is a dict ``{"events": [...], "calls": [...], "backward": int}``.
"""
from __future__ import annotations

__all__ = ["calls", "ops", "used", "events", "event", "between", "steps", "describe", "first"]


def calls(record: dict, *ops: str, backward: bool | None = None) -> list[dict]:
    """The record's dist calls in call order: only those of ``ops`` if any are named, and only
    those made during a backward pass (``backward=True``) or outside one (False); None: all."""
    return [c for c in record["calls"] if (not ops or c["op"] in ops)
            and (backward is None or c["in_backward"] == backward)]


def ops(record: dict, backward: bool | None = None) -> list[str]:
    """The ops of the record's dist calls, in call order (``backward`` as in ``calls``)."""
    return [c["op"] for c in calls(record, backward=backward)]


def used(record: dict, *names: str) -> list[str]:
    """Which of ``names`` the record's code called, each once, in first-call order."""
    seen: list[str] = []
    for op in ops(record):
        if op in names and op not in seen:
            seen.append(op)
    return seen


def first(record: dict, *ops: str) -> dict | None:
    """The record's first call of one of ``ops``, or None."""
    return next((c for c in record["calls"] if c["op"] in ops), None)


def call_name(record: dict, op: str) -> str:
    """How the record's first ``op`` call was made, for a message: "dist.all_reduce", or, for one
    that reached the backend another way, "ProcessGroup.allreduce (what dist.all_reduce runs)"."""
    via = next((c.get("via") for c in record["calls"] if c["op"] == op and c.get("via")), None)
    return f"{via} (what dist.{op} runs)" if via else f"dist.{op}"


def describe(record: dict, call: dict) -> str:
    """One of the record's calls as a rule's message names it: how it was made, its size and dtype,
    its peer or group when it has one, whether it ran during a backward pass, and where it came in
    the answer's sequence: "dist.all_reduce of 24 float32 elements during backward (call 3 of 5)"."""
    k = next((i for i, c in enumerate(record["calls"]) if c is call), -1) + 1
    how = f"{call['via']} (what dist.{call['op']} runs)" if call.get("via") else f"dist.{call['op']}"
    size = f" of {call['numel']} {call['dtype']} elements" if call.get("dtype") else ""
    peer = f" with rank {call['peer']}" if call.get("peer") is not None else ""
    group = f" on a group of {call['group_size']} ranks" if call.get("group_size") else ""
    when = " during backward" if call.get("in_backward") else ""
    place = f" (call {k} of {len(record['calls'])})" if k else ""
    return f"{how}{size}{peer}{group}{when}{place}"


def events(record: dict, kind: str | None = None, backward: bool | None = None) -> list[dict]:
    """The record's events of ``kind`` (None: of every kind) in order; with ``backward`` given,
    only those whose ``in_backward`` fact equals it (an event without that fact is in neither)."""
    return [e for e in record["events"] if (kind is None or e["event"] == kind)
            and (backward is None or e.get("in_backward") == backward)]


def event(record: dict, kind: str) -> dict | None:
    """The record's first event of ``kind``, or None."""
    return next((e for e in record["events"] if e["event"] == kind), None)


def _index(record: dict, point: str | dict | None, default: int) -> int:
    """Where ``point`` is in the record's events: an event's position, or the last event of
    that kind for a name; ``default`` for None or a kind never noted."""
    if isinstance(point, str):
        return max((i for i, e in enumerate(record["events"]) if e["event"] == point), default=default)
    return next((i for i, e in enumerate(record["events"]) if e is point), default)


def _piece(record: dict, first: int, stop: int, start: dict | None, end: dict | None) -> dict:
    """The events ``first:stop`` with the calls and backward passes from ``start`` to ``end``
    (None: the record's beginning, its end)."""
    c0, b0 = (start["calls"], start["backward"]) if start else (0, 0)
    c1, b1 = (end["calls"], end["backward"]) if end else (len(record["calls"]), record["backward"])
    return {"events": record["events"][first:stop], "calls": record["calls"][c0:c1],
            "backward": b1 - b0}


def between(record: dict, start: str | dict | None = None, end: str | dict | None = None) -> dict:
    """What happened from ``start`` to ``end``: a piece (see the module docstring).

    A point is an event of the record, or an event's kind (its last event of
    that kind), or None; a point that is None or was never noted is the
    record's beginning (``start``) or its end (``end``).  The events run
    from ``start`` (included) to ``end`` (excluded); the calls and backward
    passes are those counted at ``end`` and not yet at ``start``.
    """
    events_ = record["events"]
    first = _index(record, start, -1)
    stop = _index(record, end, len(events_))
    return _piece(record, max(first, 0), stop, events_[first] if first >= 0 else None,
                  events_[stop] if stop < len(events_) else None)


def steps(record: dict, mark: str = "step", opens: bool = False) -> list[dict]:
    """The record cut into steps at each ``mark`` event: one piece per mark.

    With ``opens=False`` the mark closes its step (noted after the optimizer
    step): a step's events run from the event after the previous mark to its
    own mark, included, and what follows the last mark is in no step.  With
    ``opens=True`` the mark opens its step (noted at its start): a step runs
    from its mark, included, to the next mark or the record's end, and what
    precedes the first mark is in no step.
    """
    marks = [i for i, e in enumerate(record["events"]) if e["event"] == mark]
    ev = record["events"]
    if opens:
        return [_piece(record, i, j, ev[i], ev[j] if j < len(ev) else None)
                for i, j in zip(marks, list(marks[1:]) + [len(ev)])]
    return [_piece(record, i + 1, j + 1, ev[i] if i >= 0 else None, ev[j])
            for i, j in zip([-1] + list(marks[:-1]), marks)]
