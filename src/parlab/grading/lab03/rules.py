"""Lab 03's graders, hints and rules: plain functions of what the ranks returned.

Graders compare every rank's output, input gradient, parameter shards and
gradients with the single-process reference (``cases``) through
``parlab.check``, and name the likely mistake (f and g swapped, a missing
all-reduce, the wrong split dimension, a bias added on every rank, heads not
reshaped, attention without the other positions).  Rules read the spy's
records: which collectives ran in forward and in backward, how many
parameters a rank kept, whether an uneven split was refused.
"""
from __future__ import annotations

import math

import torch

from ... import check
from ...cost import comm_bytes, tp_comm_elems_per_layer
from .. import assert_number
from ..harness import Graded
from .cases import (GATHERS, SCATTERS, Case, _dy_seed, _INPUT_SPLIT, _output_split, _split_map,
                          _tensor, reference, reference_module)


# ---------------------------------------------------------------- graders
def _group_sum(tensors: list, case: Case, r: int) -> torch.Tensor:
    n = len(tensors)
    members = range(n) if case.groups == "world" else range(r - r % 2, min(r - r % 2 + 2, n))
    return torch.stack([tensors[m] for m in members]).sum(0)


def _grade_fg(which: str):
    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases):
            res = g.at(i)
            xs = [_tensor(case.shape, 10 * case.seed + r) for r in range(g.n)]
            dys = [_tensor(case.shape, _dy_seed(case, r)) for r in range(g.n)]
            for r, out in enumerate(res):
                where = f"{case.describe(g.n)}, rank {r}"
                if not isinstance(out["y"], torch.Tensor):
                    return f"{g.name}.apply(x, group) returned {out['y']}, not a tensor ({where})."
                want_y = xs[r] if which == "f" else _group_sum(xs, case, r)
                want_dx = _group_sum(dys, case, r) if which == "f" else dys[r]
                size = 2 if case.groups == "pairs" else g.n
                for name, got, want in (("forward output", out["y"], want_y),
                                        ("gradient of x", out["dx"], want_dx)):
                    if got is None:
                        return (f"{g.name}: x got no gradient ({where}): backward must return the "
                                "gradient for x (and None for group).")
                    try:
                        check.assert_close(got, want, name=name, rank=r)
                    except AssertionError as err:
                        return (f"{g.name} is wrong for {where}.\n{err}\nHint: "
                                + _fg_hint(which, name, got, xs[r] if name[0] == "f" else dys[r],
                                           want, size, case))
        return None
    return grade


def _fg_hint(which: str, name: str, got, own, want, size: int, case: Case) -> str:
    group = (" Sum over the group you are given (here each pair of ranks), not the whole world: "
             "pass group=group to dist.all_reduce." if case.groups == "pairs" else "")
    if which == "f" and name == "forward output":
        return ("f's forward is the identity: return x as it is. Summing in forward is g's job "
                "(did you swap f and g?).")
    if which == "g" and name == "gradient of x":
        if check.same_values(got, size * want):
            return (f"the gradient is {size} x the upstream gradient: g's backward is the identity "
                    "(the all-reduce in backward is f's; did you swap f and g?).")
        return "g's backward returns the upstream gradient unchanged."
    if check.same_values(got, own):
        return ("this rank's own value came back unchanged: the all-reduce is missing"
                + (" in backward (f's backward sums the gradient over the group)." if which == "f"
                   else " in forward (g's forward sums x over the group).") + group)
    return "the sum must run over the ranks of `group`." + group


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


def _grade_layer(g: Graded) -> str | None:
    done = min(len(r) for r in g.results)
    for i, case in enumerate(g.cases[:done]):
        res = g.at(i)
        if not case.divisible(g.n):
            continue  # judged by the rule on uneven splits
        where = case.describe(g.n)
        bad = [(r, o) for r, o in enumerate(res) if not isinstance(o.get("y"), torch.Tensor)]
        if bad:
            return f"{g.name}'s forward returned {bad[0][1]['y']} on rank {bad[0][0]}, not a tensor ({where})."
        ref = reference(case)
        split = _split_map(case)
        message = _named_mismatch("parameter", [o["params"] for o in res], ref["params"], split, g.n, False)
        if message:
            return f"{g.name}'s shards are wrong for {where}.\n{message}"
        records = [per_rank[i] for per_rank in g.records]
        message = (_output_mismatch(case, [o["y"] for o in res], ref, g.n, "y", records)
                   or _output_mismatch(case, [o["dx"] for o in res], ref, g.n, "dx", records))
        if message:
            return f"{g.name} is wrong for {where}.\n{message}"
        message = _named_mismatch("gradient", [o["grads"] for o in res], ref["grads"], split, g.n,
                                  summed=case.kind == "sp")
        if message:
            return f"{g.name}'s parameter gradients are wrong for {where}.\n{message}"
    return None


def _output_mismatch(case: Case, got: list, ref: dict, n: int, key: str, records: list) -> str | None:
    want = ref[key]
    name = "output" if key == "y" else "gradient of the input"
    dim = _output_split(case) if key == "y" else _INPUT_SPLIT.get(case.kind)
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
        return f"every rank holds {n} x the right {'output' if key == 'y' else 'gradient'}: summed once too often (f and g swapped?)."
    if case.kind == "sp" and key == "y":
        return _sp_hint(case, got, ref, n, records)
    if case.kind == "attn" and key == "y":
        return ("check the head split: rank r holds heads r·n_head/t to (r+1)·n_head/t − 1, which are "
                "rows r·d_model/t to (r+1)·d_model/t − 1 of q, k and v's weights. Reshape each shard "
                "to (B, T, n_head/t, head_dim), with head_dim unchanged, before attention.")
    return ""


#: The bias added after the all-reduce, per kind.
_OUTPUT_BIAS = {"row": "bias", "mlp": "down.bias", "attn": "o.bias"}


_SP_GATHER = ("attention ran without the other positions. All-gather the sequence (after the "
              "LayerNorm) before attention and before the MLP, and reduce-scatter after.")


def _sp_hint(case: Case, got: list, ref: dict, n: int, records: list) -> str:
    for r, rec in enumerate(records):
        first = next((c["op"] for c in _calls(rec, False)), None)
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


# ---------------------------------------------------------------- rules
def _calls(rec: dict, backward: bool) -> list[dict]:
    return [c for c in rec["calls"] if c["in_backward"] == backward]


def _fg_rule(which: str):
    def broken(records, case, n):
        for r, rec in enumerate(records):
            forward, backward = _calls(rec, False), _calls(rec, True)
            want_fwd, want_bwd = (0, 1) if which == "f" else (1, 0)
            wrong = [c["op"] for c in rec["calls"] if c["op"] != "all_reduce"]
            if wrong:
                return f"rank {r} called dist.{wrong[0]}."
            if len(forward) != want_fwd or len(backward) != want_bwd:
                return (f"rank {r} made {len(forward)} all-reduce(s) in forward and {len(backward)} in "
                        f"backward; {which} makes {want_fwd} and {want_bwd}.")
        return None
    return broken


def _event(rec: dict, name: str) -> dict | None:
    return next((e for e in rec["events"] if e["event"] == name), None)


def _shards_only(records, case, n):
    return _shards_count(records, case, n) or _shard_views(records, case, n)


def _shards_count(records, case, n):
    if not case.divisible(n):
        return None
    full = sum(p.numel() for p in reference_module(case).parameters())
    replicated = sum(p.numel() for k, p in reference_module(case).named_parameters()
                     if _split_map(case).get(k, 0) is None)
    want = replicated + (full - replicated) // n
    for r, rec in enumerate(records):
        built = _event(rec, "built")
        if built and built["numel"] != want:
            return (f"rank {r}'s layer holds {built['numel']} parameter elements; its shard is {want} "
                    f"({'the full layer has ' + str(full) if built['numel'] >= full else 'check what it registers'}).")
    return None


def _names_both(text: str, features: int, n: int) -> bool:
    import re

    numbers = re.findall(r"\d+", text)
    return str(features) in numbers and str(n) in numbers


def _uneven_raises(what: str):
    def broken(records, case, n):
        if case.divisible(n):
            return None
        for r, rec in enumerate(records):
            seen = _event(rec, "uneven")
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


def _column_comm(records, case, n):
    if not case.divisible(n):
        return None
    shape = case.shape[:-1] + (case.features // n,)
    ok = {math.prod(shape), math.prod(shape) * n}
    for r, rec in enumerate(records):
        fwd = _calls(rec, False)
        if not case.gather and fwd:
            return f"rank {r} called dist.{fwd[0]['op']} in forward, with gather_output=False."
        for c in fwd:
            if c["op"] not in GATHERS or c["numel"] not in ok:
                return (f"rank {r} called dist.{c['op']} on {c['numel']} elements in forward; the "
                        f"only gather is the output's ({math.prod(shape)} elements per rank).")
        bwd = _calls(rec, True)
        if [c["op"] for c in bwd] != ["all_reduce"]:
            return (f"rank {r} made {[c['op'] for c in bwd]} in backward; exactly one all-reduce, "
                    "of the input's gradient.")
    return None


def _one_each(fwd_ops, bwd_ops, what):
    def broken(records, case, n):
        if not case.divisible(n):
            return None
        for r, rec in enumerate(records):
            fwd = [c["op"] for c in _calls(rec, False)]
            bwd = [c["op"] for c in _calls(rec, True)]
            if fwd != fwd_ops or bwd != bwd_ops:
                return (f"rank {r} made {fwd or 'no collective'} in forward and {bwd or 'no collective'} "
                        f"in backward; {what}.")
        return None
    return broken


def _sp_comm(records, case, n):
    for r, rec in enumerate(records):
        ops = [c["op"] for c in rec["calls"]]
        if "all_reduce" in ops:
            return f"rank {r} called dist.all_reduce."
        odd = [op for op in ops if op not in GATHERS + SCATTERS]
        if odd:
            return f"rank {r} called dist.{odd[0]}."
    return None


def _sp_counts(records, case, n):
    for r, rec in enumerate(records):
        for backward in (False, True):
            calls = _calls(rec, backward)
            gathers = sum(c["op"] in GATHERS for c in calls)
            scatters = sum(c["op"] in SCATTERS for c in calls)
            if (gathers, scatters) != (2, 2):
                phase = "backward" if backward else "forward"
                return (f"rank {r} made {gathers} all-gather(s) and {scatters} reduce-scatter(s) in "
                        f"{phase}: gather the LayerNorm's output once for q, k and v together.")
    return None


SHARDS_SAYS = ("Keep only this rank's shard of each split weight and bias: no full copy of the layer, "
               "and no view into the full weight (copy the slice).")


def _uneven_says(what: str) -> str:
    return (f"If {what} is not divisible by the number of ranks, raise a `ValueError` whose message "
            f"names both numbers ({what} and the world size); no unequal shards.")


def _inplace(records, case, n):
    for r, rec in enumerate(records):
        if rec["mutated"]:
            what = " and ".join({"x": "its input x", "dy": "the upstream gradient",
                                 "grad": "the gradient handed to backward"}.get(m, m)
                                for m in rec["mutated"])
            return (f"rank {r} modified {what} in place (an in-place dist.all_reduce on the tensor "
                    "it was given?). The caller still owns that tensor, and autograd may reuse "
                    "it: all-reduce a copy (.clone()) and return that.")
    return None


def _shard_views(records, case, n):
    """A parameter whose storage is larger than itself is a view: the full weight stays alive."""
    if not case.divisible(n):
        return None
    for r, rec in enumerate(records):
        built = _event(rec, "built")
        for name, (numel_bytes, storage_bytes) in (built or {}).get("storage", {}).items():
            if storage_bytes > numel_bytes:
                return (f"rank {r}'s parameter '{name}' is a view into a larger tensor: its storage "
                        f"holds {storage_bytes} bytes for a {numel_bytes}-byte shard, so the full "
                        "weight stays in memory on every rank. Copy the slice (.clone()); note that "
                        ".contiguous() returns a contiguous slice as it is, still a view.")
    return None


def _grade_with_uneven(what: str):
    """Uneven cases first (did it refuse?), then the layer's values."""
    judge = _uneven_raises(what)

    def grade(g: Graded) -> str | None:
        for i, case in enumerate(g.cases[:min(len(r) for r in g.records)]):
            problem = judge([per_rank[i] for per_rank in g.records], case, g.n)
            if problem:
                return f"{g.name} is wrong for {case.describe(g.n)}: {problem}"
        return _grade_layer(g)
    return grade


def _grade_bytes(g: Graded) -> str | None:
    for i, (b, s, h, t, k) in enumerate(g.cases[:len(g.results[0])]):
        want = comm_bytes(tp_comm_elems_per_layer(b, s, h, t), k)
        call = f"tp_bytes_per_layer(b={b}, s={s}, h={h}, t={t}, bytes_per_element={k})"
        mistakes = [(want / 2, "That is half: count backward too (two all-reduces in forward, two in "
                               "backward)."),
                    (want * 2, "That is twice too much: f and g each make ONE all-reduce per "
                               "sublayer, two per layer in forward and two in backward."),
                    (8 * b * s * h * k if t > 1 else -1.0,
                     "The ring factor (t − 1)/t is missing: a ring all-reduce sends 2(t − 1)/t "
                     "of the tensor per rank."),
                    (want * 8, "That is 8x too large: bits instead of bytes?"),
                    (want / k, "That is the number of elements: multiply by bytes_per_element.")]
        try:
            assert_number(g.results[0][i], want, call, mistakes, unit="bytes")
        except AssertionError as err:
            return str(err)
    return None


def _shape_error(text: str) -> str:
    if "cannot be multiplied" in text or "size of tensor" in text or "shape" in text:
        return ("the weight shard does not fit the input: did you split the wrong dimension? "
                "nn.Linear's weight is (out_features, in_features): a column-parallel layer keeps "
                "rows (dim 0), a row-parallel layer keeps columns (dim 1) and gets this rank's slice "
                "of the input features.")
    return ""


def _local_norm(records, case, n):
    """Sequence parallelism: every LayerNorm input holds this rank's T/t positions."""
    local = case.shape[1] // n
    for r, rec in enumerate(records):
        seen = _event(rec, "layer_norm")
        for shape in (seen or {}).get("shapes", []):
            if len(shape) == 3 and shape[1] != local:
                return (f"rank {r} ran a LayerNorm on {shape[1]} positions (input {tuple(shape)}); "
                        f"its own part of the sequence is T/t = {local}. Normalising the gathered "
                        "sequence repeats the same work on every rank and holds t times the "
                        "activations, which is what sequence parallelism removes: run ln1 and ln2 on "
                        "the local positions, then all-gather their output.")
    return None
