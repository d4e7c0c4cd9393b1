"""Lab 03, exercises 2 to 5: what the parallel layers share, the runner, the grader and two rules.

Every layer case builds a full reference module from a seed on each rank
(``cases.reference_module``: random biases and LayerNorm weights, so a bias
added on every rank shows), hands it to the student's class, runs forward
and backward against a fixed upstream gradient, and returns the outputs,
the input's gradient, and each parameter's shard and gradient.  The grader
runs the same module on one process and checks that outputs, input
gradients and every parameter and gradient (shards gathered along the
dimension each one is split on) match, naming the likely mistake (a missing
all-reduce, the wrong split dimension, a bias added on every rank, heads not
reshaped, attention without the other positions).  The rules every layer
states (shards only; a ``ValueError`` when the split is uneven) read the
"built" and "uneven" events the runner notes; ``GATHERS`` and ``SCATTERS``
name the collectives the layers' communication rules count.
"""
from __future__ import annotations

import contextlib
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import check
from ..diagnosis import diagnose
from ..harness import Exercise, Graded, Rule
from ..plain import plain
from ..records import event, ops
from .cases import (HANG, INPUT_SPLIT, TIMEOUT, Case, layer_input, mine, output_split, process_group,
                    reference, reference_module, split_map, team, teams, upstream)

#: The names an all-gather and a reduce-scatter go by in ``torch.distributed``.
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")


def exercise(key: str, answer: str, grade, visible: tuple, hidden: tuple, rules: tuple, **kw) -> Exercise:
    """A layer exercise: this module's runner and settle, the lab's timeout and hang hint."""
    return Exercise(key=f"lab03.{key}", answer=answer, run=run, grade=grade, visible=visible,
                    hidden=hidden, rules=rules, timeout=TIMEOUT, kind="class", settle=settle,
                    on_hang=HANG, **kw)


# ---------------------------------------------------------------- on the ranks
def run(cls, case: Case, i: int, spy) -> dict:
    import torch.distributed as dist

    from ...launch.runtime import device

    group = process_group(case)
    members = team(case, dist.get_world_size(), dist.get_rank())
    rank, n = members.index(dist.get_rank()), len(members)  # this rank's place in its group
    full = reference_module(case).to(device())
    kwargs = ({"gather_output": True} if case.gather else {}) | ({"group": group} if group is not None else {})
    if not case.divisible(n):
        try:
            with spy.watch():
                layer = cls(full, **kwargs)
        except ValueError as err:
            spy.note("uneven", raised=f"ValueError: {err}"[:300])
            return {"raised": True}
        spy.note("uneven", raised=None, shapes={k: list(p.shape) for k, p in layer.named_parameters()})
        return {"raised": False}
    # x: (..., h), every rank the same; row: (..., in/n), this rank's features; sp: (b, s/n, h), its positions
    x = mine(layer_input(case), INPUT_SPLIT.get(case.kind), rank, n).to(device()).requires_grad_()
    # dy: shaped like this rank's output: column (..., out/n) unless gathered; sp (b, s/n, h); else full
    dy = mine(upstream(case), output_split(case), rank, n).to(device())
    norms: list = []
    with spy.watch(), _layer_norm_inputs(norms if case.kind == "sp" else None):
        layer = cls(full, **kwargs)
        params = dict(layer.named_parameters())
        spy.note("built", numel=sum(p.numel() for p in layer.parameters()),
                 storage={k: [p.numel() * p.element_size(), p.untyped_storage().nbytes()]
                          for k, p in params.items()})
        y = layer(x)
        if not isinstance(y, torch.Tensor):
            return {"y": repr(y)[:100]}
        spy.note("backward")
        if y.shape == dy.shape and y.requires_grad:
            (y * dy.detach()).sum().backward()
    if norms:
        spy.note("layer_norm", shapes=norms)
    return {"y": plain(y), "dx": plain(x.grad), "params": {k: plain(p) for k, p in params.items()},
            "grads": {k: plain(p.grad) for k, p in params.items()}}


@contextlib.contextmanager
def _layer_norm_inputs(shapes: list | None):
    """Record the input shape of every ``F.layer_norm`` call (``nn.LayerNorm`` makes one)."""
    import torch.nn.functional as F

    if shapes is None:
        yield
        return
    original = F.layer_norm

    def recorded(inp, *args, **kwargs):
        shapes.append(list(inp.shape))
        return original(inp, *args, **kwargs)

    F.layer_norm = recorded
    try:
        yield
    finally:
        F.layer_norm = original


def settle(result: dict, case: Case, i: int, n: int) -> bool:
    """On each rank: is this rank's piece right?  (The ranks then stop a wrong answer together.)"""
    import torch.distributed as dist

    if "raised" in result:
        return result["raised"] is True
    if not isinstance(result.get("y"), torch.Tensor):
        return False
    members = team(case, n, dist.get_rank())
    rank, n, ref = members.index(dist.get_rank()), len(members), reference(case)
    # the reference cut as this rank holds it: a split parameter (out/n, in) or (out, in/n), a split
    # output (..., out/n) or (b, s/n, h); the sp block's replicated gradients are partial sums here
    pieces = [(result["y"], mine(ref["y"], output_split(case), rank, n)),
              (result["dx"], mine(ref["dx"], INPUT_SPLIT.get(case.kind), rank, n))]
    for name, dim in split_map(case).items():
        pieces.append((result["params"].get(name), mine(ref["params"][name], dim, rank, n)))
        if dim is not None or case.kind != "sp":
            pieces.append((result["grads"].get(name), mine(ref["grads"][name], dim, rank, n)))
    return all(check.same_values(got, want) for got, want in pieces)


# ---------------------------------------------------------------- grader
def _named_mismatch(what: str, got: dict, want: dict, split: dict, n: int, summed: bool) -> str | None:
    """Compare parameters or gradients per name: shards reassemble, replicated ones match."""
    for name, dim in split.items():
        per_rank = [g.get(name) for g in got]
        if any(p is None for p in per_rank):
            r = next(r for r, p in enumerate(per_rank) if p is None)
            if what == "parameter":
                return (f"rank {r}'s layer has no parameter named '{name}': keep the attribute "
                        f"names of the reference ({', '.join(split)}).")
            return f"'{name}' got no gradient on rank {r}: is it used in forward?"
        try:
            if dim is not None:
                check.assert_shards_reassemble(per_rank, want[name], dim=dim, name=f"{name} {what}",
                                               world_size=n)
            elif summed and what == "gradient":
                check.assert_close(torch.stack(per_rank).sum(0), want[name],
                                   name=f"{name} gradient summed over the ranks")
            else:
                for r, p in enumerate(per_rank):
                    check.assert_close(p, want[name], name=f"{name} {what}", rank=r)
        except AssertionError as err:
            return f"{err}" + _split_hint(name, dim, per_rank, want[name], what, n)
    return None


def _split_hint(name, dim, per_rank, full, what, n) -> str:
    if dim is None or not isinstance(per_rank[0], torch.Tensor) or what != "parameter":
        return ""
    other = 1 - dim
    if per_rank[0].dim() == 2 and per_rank[0].shape[other] * n == full.shape[other]:
        kind = "output" if dim == 0 else "input"
        return (f"\nHint: you split the wrong dimension: '{name}' is split along dim {other}. "
                f"nn.Linear's weight is (out_features, in_features); this layer splits the {kind} "
                f"features, dim {dim}.")
    return ""


def grade(g: Graded) -> str | None:
    done = min(len(r) for r in g.results)
    for i, case in enumerate(g.cases[:done]):
        for members in teams(case, g.n):  # each group on its own: its ranks hold its shards
            message = _grade_group(g, i, case, members)
            if message:
                return message
    return None


def _grade_group(g: Graded, i: int, case: Case, members: list[int]) -> str | None:
    n = len(members)
    if not case.divisible(n):
        return None  # judged by the rule on uneven splits
    res = [g.at(i)[m] for m in members]
    where = case.describe(g.n)
    if n < g.n:
        where += f" (the group of ranks {members}: the ranks named below are their places in it)"
    bad = [(r, o) for r, o in enumerate(res) if not isinstance(o.get("y"), torch.Tensor)]
    if bad:
        return f"{g.name}'s forward returned {bad[0][1]['y']} on rank {bad[0][0]}, not a tensor ({where})."
    ref = reference(case)
    split = split_map(case)
    message = _named_mismatch("parameter", [o["params"] for o in res], ref["params"], split, n, False)
    if message:
        return f"{g.name}'s shards are wrong for {where}.\n{message}"
    records = [g.records[m][i] for m in members]
    message = (_output_mismatch(case, [o["y"] for o in res], ref, n, "y", records)
               or _output_mismatch(case, [o["dx"] for o in res], ref, n, "dx", records))
    if message:
        return f"{g.name} is wrong for {where}.\n{message}"
    message = _named_mismatch("gradient", [o["grads"] for o in res], ref["grads"], split, n,
                              summed=case.kind == "sp")
    if message:
        return f"{g.name}'s parameter gradients are wrong for {where}.\n{message}"
    return None


def _output_mismatch(case: Case, got: list, ref: dict, n: int, key: str, records: list) -> str | None:
    want = ref[key]
    name = "output" if key == "y" else "gradient of the input"
    dim = output_split(case) if key == "y" else INPUT_SPLIT.get(case.kind)
    if any(t is None for t in got):
        r = next(r for r, t in enumerate(got) if t is None)
        return (f"the input got no gradient on rank {r}: did backward reach it? A collective's result "
                "has no gradient of its own (wrap the collective in an autograd Function, as f and g "
                "do), and detaching or torch.tensor() cuts the graph too.")
    try:
        if dim is not None:
            check.assert_shards_reassemble(got, want, dim=dim, name=name, world_size=n)
        else:
            for r, t in enumerate(got):
                check.assert_close(t, want, name=name, rank=r)
    except AssertionError as err:
        hint = _layer_hint(case, got, ref, n, key, records)
        return f"{err}" + (f"\nHint: {hint}" if hint else "")
    return None


def _layer_hint(case: Case, got: list, ref: dict, n: int, key: str, records: list) -> str:
    """A guess at the mistake behind a wrong output or input gradient (never raises)."""
    want = ref[key]
    shapes_ok = all(isinstance(t, torch.Tensor) and t.shape == want.shape for t in got)
    bias = ref["params"].get(_OUTPUT_BIAS.get(case.kind, ""), torch.zeros(()))
    if key == "y" and case.bias and shapes_ok and case.kind in _OUTPUT_BIAS:
        if all(check.same_values(t, want + (n - 1) * bias) for t in got):
            return (f"the output has the bias {n} times: every rank added it before the all-reduce "
                    "summed them. Add the bias once, after the all-reduce.")
    if shapes_ok and key == "dx" and check.same_values(torch.stack(got).sum(0), want):
        return ("the input's gradient on each rank is only that rank's part, and they add up to the "
                "right one: the all-reduce in backward (f's backward) is missing.")
    if shapes_ok and key == "y" and check.same_values(torch.stack(got).sum(0) - (n - 1) * bias, want):
        return "each rank returned its partial sum: the all-reduce in forward (g) is missing."
    if shapes_ok and all(check.same_values(t, n * want) for t in got):
        return _summed_too_often(case, n, key, records)
    if case.kind == "sp" and key == "y":
        return _sp_hint(case, got, ref, n, records)
    if case.kind == "attn" and key == "y" and shapes_ok:
        return _attention_hint(case, got, ref, n)
    return ""


#: All-reduces each layer makes in (forward, backward).
_ALL_REDUCES = {"column": (0, 1), "row": (1, 0), "mlp": (1, 1), "attn": (1, 1)}


def _summed_too_often(case: Case, n: int, key: str, records: list) -> str:
    """Every rank holds n x the right tensor: which of two mistakes that give it the records show
    (a full layer's result summed: the rank holds the full layer's parameters and made the layer's
    all-reduces; or a second all-reduce), named only when one fits every rank."""
    what = "output" if key == "y" else "gradient of the input"
    backward = key == "dx"
    pass_ = "backward" if backward else "forward"
    want = _ALL_REDUCES.get(case.kind, (None, None))[backward]
    made = [ops(rec, backward=backward).count("all_reduce") for rec in records]
    full = sum(p.numel() for p in reference_module(case).parameters())
    holds_full = [(event(rec, "built") or {}).get("numel", 0) >= full for rec in records]
    fits = [{"full": f"each rank holds the whole layer and computed its {what}, not its shard's partial sum, "
                     f"and the all-reduce in {pass_} added up {n} copies: compute with this rank's shards only."}
            if want and k == want and holds_full[r] else
            {"twice": f"rank {r} made {k} all-reduces in {pass_}, where the layer makes {want}: the {what} "
                      "was summed again after it was complete."} if want is not None and k > want else {}
            for r, k in enumerate(made)]
    named = diagnose(fits)
    return f"every rank holds {n} x the right {what}" + (f": {named}" if named else
                                                          f" (all-reduces in {pass_} per rank: {made}).")


_RESHAPE = ("rank r holds heads r·n_head/t to (r+1)·n_head/t − 1, which are rows r·d_model/t to "
            "(r+1)·d_model/t − 1 of q, k and v's weights. Reshape each shard to (B, T, n_head/t, "
            "head_dim), with head_dim unchanged, before attention.")


def _sharded_attention(full: nn.Module, x: torch.Tensor, n: int, heads: int, causal: bool = True,
                       scale: float | None = None) -> torch.Tensor:
    """The tensor-parallel attention's output when each rank views its rows of q, k, v as ``heads``
    heads, masks causally or not, and scales the scores by ``scale`` (None: 1/√(its head size))."""
    d = full.q.out_features
    rows = d // n
    y = torch.zeros(())
    with torch.no_grad():
        for r in range(n):
            part = slice(r * rows, (r + 1) * rows)
            q, k, v = (F.linear(x, m.weight[part], None if m.bias is None else m.bias[part])
                       for m in (full.q, full.k, full.v))
            B, T, _ = q.shape
            q, k, v = (t.view(B, T, heads, -1).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, rows/heads)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            y = y + F.linear(a.transpose(1, 2).reshape(B, T, rows), full.o.weight[:, part])
        return y if full.o.bias is None else y + full.o.bias


def _attention_hint(case: Case, got: list, ref: dict, n: int) -> str:
    """The attention mistake whose output every rank returned, when exactly one known mistake gives it:
    a shard run as one head or as all n_head heads, no causal mask, or the scores scaled wrong."""
    full, x = ref["module"], ref["x"]
    heads, hd = case.features, full.head_dim
    if heads % n:
        return ""
    per = heads // n
    variants = {
        "one head": ((1, True, None), "each rank ran attention on its whole shard as ONE head. " + _RESHAPE),
        "all heads": ((heads, True, None), "each rank split its shard into all n_head heads (of head_dim/t "
                      "each): it holds only n_head/t of them. " + _RESHAPE),
        "no mask": ((per, False, None), "the attention is not causal: a position attended to later ones. "
                    "Mask the scores above the diagonal (is_causal=True), as the full layer does."),
        "unscaled": ((per, True, 1.0), "the scores q·kᵀ were not scaled: multiply them by 1/√head_dim."),
        "d_model scale": ((per, True, (heads * hd) ** -0.5), "the scores were scaled by 1/√d_model; "
                          "attention scales them by 1/√head_dim (the size of one head)."),
        "shard scale": ((per, True, (per * hd) ** -0.5), "the scores were scaled by 1/√(d_model/t), the "
                        "shard's width; attention scales them by 1/√head_dim (the size of one head)."),
    }
    rows = heads * hd // n
    outputs = {name: _sharded_attention(full, x, n, *args) for name, (args, _) in variants.items()
               if rows % args[0] == 0}
    outputs = {k: v for k, v in outputs.items() if not check.same_values(v, ref["y"])}
    return diagnose([{name: variants[name][1] for name, y in outputs.items() if check.same_values(t, y)}
                     for t in got])


#: The bias added after the all-reduce, per kind.
_OUTPUT_BIAS = {"row": "bias", "mlp": "down.bias", "attn": "o.bias"}

_SP_GATHER = ("attention ran without the other positions. All-gather the sequence (after the "
              "LayerNorm) before attention and before the MLP, and reduce-scatter after.")


def _sp_hint(case: Case, got: list, ref: dict, n: int, records: list) -> str:
    for r, rec in enumerate(records):
        first = next(iter(ops(rec, backward=False)), None)
        if first not in GATHERS:
            return (f"rank {r}'s first collective in forward was {first or 'none'}, not an all-gather: "
                    + _SP_GATHER)
    block, x = ref["module"], ref["x"]
    with torch.no_grad():
        alone = [block(chunk) for chunk in x.chunk(n, dim=1)]
    for r, t in enumerate(got):
        if isinstance(t, torch.Tensor) and t.shape == alone[r].shape and check.same_values(t, alone[r]):
            return f"rank {r}'s output is what the block gives for its part of the sequence alone: " + _SP_GATHER
    return ""


def grade_with_uneven(what: str):
    """Uneven cases first (did it refuse?), then the layer's values."""
    judge = _uneven_raises(what)

    def uneven_first(g: Graded) -> str | None:
        for i, case in enumerate(g.cases[:min(len(r) for r in g.records)]):
            problem = judge([per_rank[i] for per_rank in g.records], case, g.n)
            if problem:
                return f"{g.name} is wrong for {case.describe(g.n)}: {problem}"
        return grade(g)
    return uneven_first


# ---------------------------------------------------------------- rules every layer states
def _shards_only(records, case, n):
    return _shards_count(records, case, n) or _shard_views(records, case, n)


def _shards_count(records, case, n):
    n = len(team(case, n, 0))
    if not case.divisible(n):
        return None
    full = sum(p.numel() for p in reference_module(case).parameters())
    replicated = sum(p.numel() for k, p in reference_module(case).named_parameters()
                     if split_map(case).get(k, 0) is None)
    want = replicated + (full - replicated) // n
    for r, rec in enumerate(records):
        built = event(rec, "built")
        if built and built["numel"] != want:
            return (f"rank {r}'s layer holds {built['numel']} parameter elements; its shard is {want} "
                    f"({'the full layer has ' + str(full) if built['numel'] >= full else 'check what it registers'}).")
    return None


def _shard_views(records, case, n):
    """A parameter whose storage is larger than itself is a view: the full weight stays alive."""
    if not case.divisible(n):
        return None
    for r, rec in enumerate(records):
        built = event(rec, "built")
        for name, (numel_bytes, storage_bytes) in (built or {}).get("storage", {}).items():
            if storage_bytes > numel_bytes:
                return (f"rank {r}'s parameter '{name}' is a view into a larger tensor: its storage "
                        f"holds {storage_bytes} bytes for a {numel_bytes}-byte shard, so the full "
                        "weight stays in memory on every rank. Copy the slice (.clone()); note that "
                        ".contiguous() returns a contiguous slice as it is, still a view.")
    return None


def uneven_rule(what: str) -> Rule:
    """Refuse a split of ``what`` that does not divide evenly, naming both numbers."""
    return Rule(_uneven_says(f"`{what}`"), _uneven_raises(what))


def _uneven_says(what: str) -> str:
    return (f"If {what} is not divisible by the number of ranks, raise a `ValueError` whose message "
            f"names both numbers ({what} and the world size); no unequal shards.")


def _names_both(text: str, features: int, n: int) -> bool:
    numbers = re.findall(r"\d+", text)
    return str(features) in numbers and str(n) in numbers


def _uneven_raises(what: str):
    def broken(records, case, n):
        if case.divisible(n):
            return None
        for r, rec in enumerate(records):
            seen = event(rec, "uneven")
            if seen is None:
                continue
            if seen["raised"] is None:
                return (f"rank {r} accepted {what} {case.features} on {n} ranks, which does not divide "
                        f"evenly (its parameters: {seen['shapes']}); raise a ValueError whose message "
                        f"names both numbers ({what} {case.features} and the world size {n}). Unequal "
                        "shards break the all-gathers of equal pieces and the even split of the work.")
            if not _names_both(seen["raised"], case.features, n):
                return (f"rank {r} raised {seen['raised']!r} for {what} {case.features} on {n} ranks: "
                        f"right to refuse, but the message must name both numbers, {what} "
                        f"({case.features}) and the world size ({n}), so the user sees what to change.")
        return None
    return broken


def one_each(fwd_ops, bwd_ops, what):
    def broken(records, case, n):
        if not case.divisible(n):
            return None
        for r, rec in enumerate(records):
            fwd, bwd = ops(rec, backward=False), ops(rec, backward=True)
            if fwd != fwd_ops or bwd != bwd_ops:
                return (f"rank {r} made {fwd or 'no collective'} in forward and {bwd or 'no collective'} "
                        f"in backward; {what}.")
        return None
    return broken


SHARDS_ONLY = Rule("Keep only this rank's shard of each split weight and bias: no full copy of the layer, "
                   "and no view into the full weight (copy the slice).", _shards_only)
