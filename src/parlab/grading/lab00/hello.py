"""Lab 00, exercise 1: ``hello()`` on real ranks, its cases, grader and rule.

Every rank calls ``hello()`` once (2 ranks visible, 3 hidden) and must return
"hello from rank r of N", with r and N asked of torch.distributed.  The
grader names the usual mistake from what the ranks returned (None, one
rank's greeting on every rank, ranks counted from 1, a fixed N, stray
whitespace).  The notebook's rule beyond the return value, that each rank
also prints its greeting on a line of its own, is judged on what each rank
printed (the spy's ``printed``).
"""
from __future__ import annotations

from ..harness import Exercise, Graded, Rule
from ..numbers import shown
from ..plain import plain
from .call import Call


def expected_hello(rank: int, world_size: int) -> str:
    return f"hello from rank {rank} of {world_size}"


# ---------------------------------------------------------------- on the ranks
def run(answer, case: Call, i: int, spy) -> object:
    with spy.watch():
        got = answer()
    return plain(got, keep=(bool, int, float, str), tensors=None, containers=())  # a str or a number kept


# ---------------------------------------------------------------- grader
def message(rank: int, got, results: list, n: int) -> str | None:
    """What is wrong with rank ``rank``'s return value, or None."""
    want = expected_hello(rank, n)
    if got == want:
        return None
    if got is None:
        return (f"rank {rank} returned None: your hello() does not return the message. "
                "Add `return message` at the end.")
    if not isinstance(got, str):
        text, kind = shown(got)
        return f"rank {rank} returned {text} ({kind}); hello() should return the string {want!r}."
    if n > 1 and all(isinstance(r, str) for r in results) and len(set(results)) == 1:
        return (f"every rank returned {got!r}: each rank must report its own rank. "
                "Ask torch.distributed with dist.get_rank() instead of using a fixed number.")
    if got == expected_hello(rank + 1, n):
        return (f"rank {rank} returned {got!r}, expected {want!r}: ranks count from 0, "
                "so use dist.get_rank() as it is, without adding 1.")
    if got.strip() == want:
        return (f"rank {rank} returned {got!r}, expected {want!r}: remove the spaces or newline "
                "around the message.")
    if got.startswith(f"hello from rank {rank} of "):
        return (f"rank {rank} returned {got!r}, expected {want!r}: the job has {n} ranks; "
                "take N from dist.get_world_size().")
    return (f"rank {rank} returned {got!r}, expected exactly {want!r} "
            "(check spelling, spaces and capitals).")


def grade(graded: Graded) -> str | None:
    results = graded.at(0)
    for rank, got in enumerate(results):
        wrong = message(rank, got, results, graded.n)
        if wrong:
            return f"{graded.name}() on {graded.n} rank{'s' if graded.n != 1 else ''}: {wrong}"
    return None


# ---------------------------------------------------------------- rule
def not_printed(records: list, case: Call, n: int) -> str | None:
    """Which rank did not print its greeting on a line of its own, or None."""
    for rank, record in enumerate(records):
        want = expected_hello(rank, n)
        printed = str(record.get("printed", ""))
        lines = [line.strip() for line in printed.splitlines()]
        if want in lines:
            continue
        if not printed.strip():
            return (f"rank {rank} printed nothing on standard output: hello() must also "
                    "`print(message)`.")
        near = next((line for line in lines if want in line), None)
        if near is not None:
            return (f"rank {rank} printed {near!r}, with more than the greeting on that line: print "
                    "the message alone (the launcher itself adds the [rank r] prefix or box).")
        first = repr(lines[0]) if len(lines) == 1 else f"{len(lines)} lines, starting {lines[0]!r},"
        return f"rank {rank} printed {first} but no line {want!r}: print the message you return."
    return None


PRINTS = Rule("Each rank prints its greeting, the same string it returns, on a line of its own "
              "(other lines may be printed too).", not_printed)

HELLO = Exercise(key="lab00.hello", answer="hello", run=run, grade=grade,
                 visible=((2, (Call("hello", on_ranks=True),)),),
                 hidden=((3, (Call("hello", on_ranks=True),)),),
                 rules=(PRINTS,), timeout=60.0)
