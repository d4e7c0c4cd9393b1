"""Lab 06, section 1: the coordinates of a rank on a pp × dp × tp mesh, graded without a launch.

The student writes ``coords(rank, pp, dp, tp) -> (p, d, t)``,
``rank_of(p, d, t, pp, dp, tp) -> rank`` and ``groups(axis, pp, dp, tp)``
(every group of ranks along ``axis``).  The reference is
``parlab.parallel.mesh.Mesh``: rank = p·(dp·tp) + d·tp + t, TP innermost.

When an answer is wrong, the graders try the other five orders of the axes
(which axis varies fastest) and say which layout the answer used, since
"TP outermost" (TP groups of strided ranks, which cross nodes) is the usual
mistake.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...parallel.mesh import Mesh
from ..harness import Exercise, Graded
from ..plain import plain

AXES = ("pp", "dp", "tp")
_LETTER = {"pp": "p", "dp": "d", "tp": "t"}
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Shape:
    """One mesh shape a coordinate function is called on, for every rank (or every group)."""

    pp: int
    dp: int
    tp: int

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def describe(self, n: int) -> str:
        return f"pp={self.pp}, dp={self.dp}, tp={self.tp} ({self.world} ranks)"


def _plain_ints(value):
    """A returned coordinate triple / rank / group list as plain ints (lists as tuples, torch and
    numpy values through ``tolist``), anything else (a bool, a float) described."""
    return plain(value, keep=(int,), tensors="list", containers=(list, tuple))


def _is_ints(value, length: int | None = None) -> bool:
    return (isinstance(value, tuple) and all(isinstance(v, int) for v in value)
            and (length is None or len(value) == length))


# ---------------------------------------------------------------- the layouts an answer may have used
def _layout(shape: Shape, fastest_first: tuple[str, str, str]):
    """coords for a layout where fastest_first[0] varies fastest, then [1], then [2]."""
    sizes = {"pp": shape.pp, "dp": shape.dp, "tp": shape.tp}

    def coords(rank: int) -> tuple[int, int, int]:
        out, rest = {}, rank
        for axis in fastest_first:
            rest, out[axis] = divmod(rest, sizes[axis])
        return out["pp"], out["dp"], out["tp"]
    return coords


def _orders():
    """Every order of the axes other than the right one (tp fastest, then dp, then pp)."""
    return [o for o in itertools.permutations(("tp", "dp", "pp")) if o != ("tp", "dp", "pp")]


def _order_words(order) -> str:
    fast = " fastest, then ".join(_LETTER[a] for a in order[:2])
    return f"{fast}, with {_LETTER[order[2]]} slowest"


_FORMULA = ("TP is innermost: rank = p·(dp·tp) + d·tp + t, so t = rank % tp, "
            "d = (rank // tp) % dp and p = rank // (dp·tp).")


def _layout_hint(got_of, shape: Shape, what: str) -> str:
    """Which other layout ``got_of(order)`` matched, in words, or ''."""
    for order in _orders():
        if got_of(order):
            return (f" Your {what} follows the layout where {_order_words(order)}"
                    + (": TP outermost, so the ranks of a TP group are strided and, with 8 GPUs "
                       "per node, spread over nodes." if order[-1] == "tp" else ".")
                    + " " + _FORMULA)
    return " " + _FORMULA


# ---------------------------------------------------------------- coords
def _run_coords(fn, case: Shape, i, spy):
    """Per rank: the returned triple as plain ints, and the name of the type it came back as."""
    with spy.watch():
        out = [fn(r, case.pp, case.dp, case.tp) for r in range(case.world)]
    return [_plain_ints(v) for v in out], [type(v).__name__ for v in out]


def _grade_coords(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        got, kinds = g.results[0][i]
        got = list(got)
        mesh = Mesh(case.pp, case.dp, case.tp)
        for r, value in enumerate(got):
            call = f"{g.name}({r}, pp={case.pp}, dp={case.dp}, tp={case.tp})"
            if not _is_ints(value, 3):
                return (f"{call} returned {value.get('repr', value) if isinstance(value, dict) else value!r}; "
                        "it should return a tuple of three ints (p, d, t).")
            if kinds[r] == "list":
                return (f"{call} returned the list {list(value)}; it should return the tuple {value}: "
                        "coordinates are a fixed triple (p, d, t), compared and used as dict keys as one.")
            want = tuple(mesh.coords(r))
            if value != want:
                hint = _layout_hint(lambda o: all(got[k] == _layout(case, o)(k) for k in range(case.world)),
                                    case, "coords")
                return f"{call} returned {value}, expected {want}.{hint}"
    return None


# ---------------------------------------------------------------- rank_of
def _run_rank_of(fn, case: Shape, i, spy):
    with spy.watch():
        return [_plain_ints(fn(*Mesh(case.pp, case.dp, case.tp).coords(r), case.pp, case.dp, case.tp))
                for r in range(case.world)]


def _grade_rank_of(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        got = g.results[0][i]
        mesh = Mesh(case.pp, case.dp, case.tp)
        for r, value in enumerate(got):
            p, d, t = mesh.coords(r)
            call = f"{g.name}({p}, {d}, {t}, pp={case.pp}, dp={case.dp}, tp={case.tp})"
            if isinstance(value, dict) or not isinstance(value, int):
                shown = value.get("repr") if isinstance(value, dict) else repr(value)
                return f"{call} returned {shown}; it should return one int, the rank."
            if value != r:
                inverse = ""
                if 0 <= value < case.world:
                    inverse = (f" rank_of must undo coords: coords({value}) is "
                               f"{tuple(mesh.coords(value))}, not ({p}, {d}, {t}).")
                elif value >= case.world:
                    inverse = f" There are only {case.world} ranks (0 to {case.world - 1}): a stride is too large."
                if len(set(got)) < len(got):
                    inverse += " Two coordinates give the same rank, so it cannot be undone."

                def same(order):
                    back = {_layout(case, order)(k): k for k in range(case.world)}
                    return all(got[k] == back[tuple(mesh.coords(k))] for k in range(case.world))
                return f"{call} returned {value}, expected {r}.{inverse}{_layout_hint(same, case, 'rank_of')}"
    return None


# ---------------------------------------------------------------- groups
def _run_groups(fn, case: Shape, i, spy):
    with spy.watch():
        return {axis: _plain_ints(fn(axis, case.pp, case.dp, case.tp)) for axis in ("tp", "dp", "pp")}


def _normal(groups) -> list[list[int]] | None:
    if not isinstance(groups, tuple) or not all(_is_ints(x) for x in groups):
        return None
    return sorted(sorted(x) for x in groups)


def _groups_in(case: Shape, order, axis: str) -> list[list[int]]:
    """The groups along ``axis`` under the layout ``order`` (fastest axis first), normalised."""
    layout, by = _layout(case, order), {}
    for r in range(case.world):
        by.setdefault(tuple(c for a, c in zip(AXES, layout(r)) if a != axis), []).append(r)
    return sorted(by.values())


def _grade_groups(g: Graded) -> str | None:
    for i, case in enumerate(g.cases):
        mesh = Mesh(case.pp, case.dp, case.tp)
        for axis, got in g.results[0][i].items():
            call = f"{g.name}({axis!r}, pp={case.pp}, dp={case.dp}, tp={case.tp})"
            norm = _normal(got)
            if norm is None:
                shown = got.get("repr") if isinstance(got, dict) else repr(got)
                return f"{call} returned {shown}; it should return a list of lists of ranks (ints)."
            want = mesh.groups(axis)
            if norm == sorted(want):
                continue
            msg = f"{call} returned {[list(x) for x in got]}, expected {want}."
            other = [a for a in AXES if a != axis and sorted(mesh.groups(a)) == norm]
            matching = [o for o in _orders() if _groups_in(case, o, axis) == norm]
            order = next((o for o in matching if o[-1] == "tp"), matching[0] if matching else None)
            if other:
                msg += (f" Those are the groups along {other[0]!r}: the ranks that share every "
                        f"coordinate except {_LETTER[other[0]]}.")
            if order:
                msg += f" Your groups follow the layout where {_order_words(order)}."
                if order[-1] == "tp":
                    msg += (" That is TP outermost: a TP group is then strided ranks, which on "
                            f"nodes of {GPUS_PER_NODE} GPUs (ranks 8k to 8k + 7) sit on different "
                            "nodes, so TP's per-layer all-reduces would cross the slow links.")
            covered = sorted(r for x in norm for r in x)
            if covered != list(range(case.world)):
                msg += (f" Every rank must be in exactly one group along an axis; yours cover "
                        f"{covered}.")
            return msg + " " + _FORMULA
    return None


# ---------------------------------------------------------------- the exercises
_SHAPES = tuple(Shape(*s) for s in ((2, 2, 2), (3, 1, 2), (2, 3, 2), (1, 5, 1), (1, 2, 4), (2, 1, 3),
                                    (1, 1, 1), (4, 2, 1)))
_HIDDEN_SHAPES = tuple(Shape(*s) for s in ((2, 2, 4), (1, 2, 8), (3, 2, 2), (5, 1, 3), (1, 1, 6),
                                           (2, 4, 1), (4, 3, 2)))

COORDS = Exercise(key="lab06.coords", answer="coords", run=_run_coords, grade=_grade_coords,
                  visible=((1, _SHAPES),), hidden=(), solo=True)
RANK_OF = Exercise(key="lab06.rank_of", answer="rank_of", run=_run_rank_of, grade=_grade_rank_of,
                   visible=((1, _SHAPES),), hidden=(), solo=True)
GROUPS = Exercise(key="lab06.groups", answer="groups", run=_run_groups, grade=_grade_groups,
                  visible=((1, _SHAPES),), hidden=((1, _HIDDEN_SHAPES),), solo=True)
