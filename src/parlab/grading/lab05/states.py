"""Lab 05, Exercises 3-5: which state of a ZeRO answer first differs from single-process training.

The verdict on a ZeRO answer is its parameters (``zero.grade``); this module changes no verdict.
When the parameters differ, it says where the difference starts, from what the answer's
optimizers held:

- On the ranks, ``Recorder`` notes every tensor handed to ``make_optimizer`` with its values
  then, and after every ``optimizer.step()`` (a step post-hook), for each tensor the step moved
  (one with a ``.grad``): the gradient it stepped with, its values after the step (the fp32
  master shard) and its state (SGD's ``momentum_buffer``, AdamW's ``exp_avg`` and
  ``exp_avg_sq``), each as plain floats.
- In the grader, ``placed`` finds each handed tensor's place in the flat vector of the
  trainable parameters (in ``params`` order, the vector the notebook shards): its values at
  hand-over equal the reference's there, contiguously, and are zero after that (padding).  That
  places the notebook's layout (one flat shard of ceil(Ψ / N) elements at rank · ceil(Ψ / N),
  the last one padded), ``tensor_split``'s uneven shards, a padded shard per tensor and ZeRO-3's
  padded shard per layer.  When a stepped tensor has no such place (another layout, or values
  changed before hand-over), ``first_difference`` says nothing.
- ``first_difference`` then goes through the steps 1, 2, ... and, in each, through what a step
  computes in order: which elements some rank's optimizer stepped (and how often), the gradient
  each tensor was stepped with (against the single-process full-batch gradient at its
  elements), each state tensor, and the values after the step.  The first that differs on any
  rank is reported: the state, the step, the ranks, the elements, one value got and expected,
  and, where it holds, that the state is one constant multiple of the reference's or, for a
  gradient that is none, that it is the reference's gradient of other elements (the shard's
  bounds shifted).  A shard of padding only is skipped.  Where everything
  matched up to the step whose parameters differ, the message says so: what differs is how
  the updated shards reach the model's parameters.

It names no cause: ``zero`` names one, from the parameters, under ``diagnosis.diagnose``.
"""
from __future__ import annotations

import torch

from ...check import ranks_phrase
from ...check.phrases import index_runs, short_number
from ...check.tensors import ratio_phrase, simple_ratio
from ..plain import plain

#: How a message names each state, in the order a step computes them (the state tensors between
#: the gradient and the values, in ``STATE_ORDER``).
WORDS = {"stepped": "which elements the optimizers stepped, and how often",
         "grad": "the gradient the optimizers stepped with",
         "momentum_buffer": "SGD's momentum (momentum_buffer)",
         "exp_avg": "Adam's first moment (exp_avg)",
         "exp_avg_sq": "Adam's variance (exp_avg_sq)",
         "value": "the shard's values after the step (the fp32 master)"}
STATE_ORDER = ("momentum_buffer", "exp_avg", "exp_avg_sq")


# ---------------------------------------------------------------- on the ranks
def _floats(t) -> tuple | None:
    """A tensor's elements as plain floats (flat), or None when they are not plain numbers."""
    values = plain(t.detach().reshape(-1), tensors="list", as_float=True)
    return values if isinstance(values, tuple) and all(type(v) is float for v in values) else None


class Recorder:
    """What one rank's optimizers were handed and stepped with (see the module docstring).

    ``phase`` is the index of the forward/backward/step the rank is in (set by the runner);
    ``optimizer(opt, tensors)`` is called by the grader's ``make_optimizer``.
    """

    def __init__(self):
        self.phase = -1          # -1: the answer's constructor
        self.handed: list = []   # per tensor key: (phase, its values when handed)
        self.stepped: list = []  # per optimizer.step(): {"phase", "tensors": [{key, grad, value, state}]}
        self._keys: dict[int, int] = {}
        self._alive: list = []   # the handed tensors, so that no id is reused for another

    def _key(self, t) -> int:
        if id(t) not in self._keys:
            self._keys[id(t)] = len(self.handed)
            self._alive.append(t)
            self.handed.append((self.phase, _floats(t)))
        return self._keys[id(t)]

    def optimizer(self, opt, tensors) -> None:
        try:
            for t in tensors:
                self._key(t)
            opt.register_step_post_hook(self._after_step)
        except Exception:  # noqa: BLE001 - a tensor or optimizer the record cannot read: none kept
            pass

    def _after_step(self, opt, args, kwargs) -> None:
        try:
            moved = []
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue  # not stepped
                    state = opt.state.get(p, {})
                    tensors = {k: v for k, v in state.items()
                               if isinstance(v, torch.Tensor) and v.dim() and v.numel() == p.numel()}
                    moved.append({"key": self._key(p), "grad": _floats(p.grad), "value": _floats(p),
                                  "state": {k: _floats(v) for k, v in tensors.items()}})
            self.stepped.append({"phase": self.phase, "tensors": moved})
        except Exception:  # noqa: BLE001 - never break the answer's step; the record is incomplete
            self.stepped.append({"phase": self.phase, "tensors": None})

    def result(self) -> dict:
        return {"handed": list(self.handed), "stepped": list(self.stepped)}


# ---------------------------------------------------------------- in the grader
def reference_step(opt, trainable: list) -> dict:
    """What single-process training's optimizer stepped with and holds after one step, flat over
    the trainable parameters: ``{"grad": (Ψ,), "state": {name: (Ψ,)}}``."""
    names = [k for k in STATE_ORDER if all(isinstance(opt.state[p].get(k), torch.Tensor) for p in trainable)]
    return {"grad": torch.cat([p.grad.reshape(-1) for p in trainable]).double(),
            "state": {k: torch.cat([opt.state[p][k].reshape(-1) for p in trainable]).double() for k in names}}


def _vec(values) -> torch.Tensor | None:
    if not isinstance(values, tuple) or not all(type(v) is float for v in values):
        return None
    return torch.tensor(values, dtype=torch.float64)


def placed(values: torch.Tensor, frame: torch.Tensor) -> tuple[int, int] | None:
    """``(offset, elements)``: where ``values`` sit in ``frame`` (the first ``elements`` equal
    ``frame[offset:]``, the rest zeros), ``(0, 0)`` for padding only, None for no single place."""
    if values.numel() == 0:
        return None
    if not bool(values.any()):
        return 0, 0
    found = []
    for o in (frame == values[0]).nonzero().flatten().tolist():
        m = min(values.numel(), frame.numel() - o)
        same = values[:m] == frame[o:o + m]
        k = m if bool(same.all()) else int((~same).nonzero()[0])
        if not bool(values[k:].any()):
            found.append((o, k))
    return found[0] if len(found) == 1 else None


def _differ(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """True where ``got`` is off ``want`` by more than float32 reduction noise (relative to each
    element and to the largest: a sum in another order, not another value)."""
    scale = float(want.abs().max()) if want.numel() else 0.0
    return ~((got - want).abs() <= 1e-4 * want.abs() + 1e-5 * scale + 1e-12)


def _ratio(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The one factor r (not 1) with ``got`` = r · ``want`` to the noise ``_differ`` allows, or None."""
    norm = float(want @ want)
    if not norm:
        return None
    r = float(got @ want) / norm
    return None if abs(r - 1) < 1e-3 or bool(_differ(got, r * want).any()) else r


def _range(o: int, m: int) -> str:
    return f"{o}..{o + m - 1}" if m > 1 else f"{o}"


def _located(got: torch.Tensor, full: torch.Tensor, o: int) -> str:
    """Where else in ``full`` the values ``got`` sit, when exactly one other place fits."""
    m = got.numel()
    if m < 2 or not bool(got.any()):
        return ""
    padded = torch.cat([full, torch.zeros(m, dtype=full.dtype)])
    fits = [p for p in range(full.numel()) if p != o and not bool(_differ(got, padded[p:p + m]).any())]
    if len(fits) != 1:
        return ""
    return (f"; its values are the reference's at elements {_range(fits[0], m)}, {fits[0] - o:+d} from "
            "the elements the shard holds")


LEAD = "Compared with single-process training after each step,"
WHERE = "(of the flat vector of the trainable parameters, in params order)"


def first_difference(case, n: int, s: int, results: list, ref_flats: list, ref_steps: list) -> str:
    """The first state that differs, at steps 1..``s``, over every rank (see the module
    docstring), or "" when the answer's optimizers cannot be placed or no record came back."""
    try:
        return _first_difference(case, n, s, results, ref_flats, ref_steps)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):  # a record of another shape
        return ""


def _first_difference(case, n: int, s: int, results: list, ref_flats: list, ref_steps: list) -> str:
    frame_mask = ~case.frozen_mask()
    flats = [f[frame_mask].double() for f in ref_flats]  # per step (Ψ,): the trainable parameters
    ranks = []
    for res in results:
        rec = res.get("optimizers") if isinstance(res, dict) else None
        if not isinstance(rec, dict) or not rec.get("stepped"):
            return ""
        places = []
        for phase, values in rec["handed"]:
            v = _vec(values)
            where = placed(v, flats[max(phase, 0)]) if v is not None and phase < len(flats) else None
            places.append((where, None if v is None else v.numel()))
        ranks.append((places, rec["stepped"]))
    for t in range(min(s, len(ref_steps))):
        snaps = []  # per rank: {key: (times stepped in step t + 1, the last snapshot)}
        for places, stepped in ranks:
            mine: dict = {}
            for step in stepped:
                if step["phase"] != t:
                    continue
                if step["tensors"] is None:
                    return ""
                for snap in step["tensors"]:
                    k = snap["key"]
                    if not (0 <= k < len(places)) or places[k][0] is None:
                        return ""  # a stepped tensor the reference cannot place: say nothing
                    mine[k] = (mine.get(k, (0, None))[0] + 1, snap)
            snaps.append(mine)
        found = _at_step(n, t, ranks, snaps, flats, ref_steps[t])
        if found:
            steps = f"step{'s 1 to' if t > 1 else ''} {t}"
            return f"{LEAD} the first state of the optimizers that differs is {found}" + (
                f"; at {steps} every one of them matched on every rank." if t else ".")
    return (f"{LEAD} every rank's optimizer stepped its elements as the reference did at steps 1 to "
            f"{s} (the elements stepped, the gradient, the optimizer's state and the values after "
            "the step all match): what differs is how the updated shards reach the model's "
            "parameters.") if s else ""


def _at_step(n, t, ranks, snaps, flats, ref) -> str:
    """The first state that differs at step ``t + 1`` (0-based ``t``): the state, then the facts."""
    # which elements were stepped, and how often
    covered = torch.zeros(flats[0].numel(), dtype=torch.bool)
    for r, ((places, _), mine) in enumerate(zip(ranks, snaps)):
        for k, (times, _) in mine.items():
            o, m = places[k][0]
            covered[o:o + m] = True
            if times > 1 and m:
                return (f"{WORDS['stepped']}, at step {t + 1}: rank {r}'s optimizer stepped its shard "
                        f"of elements {_range(o, m)} {WHERE} {times} times in that step; "
                        "single-process training steps once")
    moved = (flats[t + 1] != flats[t]).nonzero().flatten()
    missed = moved[~covered[moved]].tolist()
    if missed:
        return (f"{WORDS['stepped']}, at step {t + 1}: no rank's optimizer stepped elements "
                f"{index_runs(missed)} {WHERE}, which single-process training moved")
    names = ["grad"] + [k for k in STATE_ORDER if k in ref["state"]] + ["value"]
    for i, kind in enumerate(names):
        want_all = ref["grad"] if kind == "grad" else flats[t + 1] if kind == "value" else ref["state"][kind]
        bad_ranks, detail = [], ""
        for r, ((places, _), mine) in enumerate(zip(ranks, snaps)):
            for k, (_, snap) in sorted(mine.items()):
                (o, m), size = places[k]
                if not m:
                    continue  # padding only
                got = _vec(snap[kind] if kind in ("grad", "value") else snap["state"].get(kind))
                want = want_all[o:o + m]
                if got is None or got.numel() != size:
                    bad_ranks.append(r)
                    detail = detail or (f"rank {r}'s optimizer holds no {kind} of the same size for its "
                                        f"shard of elements {_range(o, m)} {WHERE}")
                    break
                bad = _differ(got[:m], want)
                if bool(bad.any()):
                    bad_ranks.append(r)
                    detail = detail or _detail(r, o, m, got[:m], want, bad, kind, n, want_all)
                    break
        if bad_ranks:
            matched = (f"; before it in that step, {_and([WORDS[k] for k in names[:i]])} matched on "
                       "every rank" if i else "")
            return f"{WORDS[kind]}, at step {t + 1}, on {ranks_phrase(bad_ranks)}: {detail}{matched}"
    return ""


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _detail(r, o, m, got, want, bad, kind, n, want_all) -> str:
    """Rank ``r``'s shard of elements ``o``..``o + m - 1``: where ``got`` differs from ``want``, one
    value of each, and the ratio (or, for a gradient, the other place its values sit) when one fits."""
    idx = bad.nonzero().flatten()
    first = int(idx[0])
    which = "all" if len(idx) == m else f"{len(idx)} ({index_runs((idx + o).tolist())})"
    text = (f"rank {r}'s shard of elements {_range(o, m)} {WHERE} differs at {which} of its {m}; at "
            f"element {o + first}: got {short_number(float(got[first]))}, expected "
            f"{short_number(float(want[first]))}")
    ratio = _ratio(got, want)
    if ratio is not None and (simple_ratio(ratio) or m >= 4):
        text += f"; it is {ratio_phrase(ratio, n, 'the reference')}"
    elif kind == "grad":
        text += _located(got, want_all, o)
    return text
