"""Lab 07, exercise 2: the zig-zag split that balances causal ring attention.

``fn(s, c)`` returns a (c, s/c) LongTensor whose row r lists the global
positions rank r holds: the sequence cut into 2c equal chunks, rank r taking
chunks r and 2c − 1 − r (the load-balanced layout Llama 3 trained with,
Dubey et al. 2024, arXiv 2407.21783, §3.3.2).  A length that is not
a multiple of 2c must raise a ValueError whose message says so (the word
"divisible" or "multiple") and names both numbers.  Graded in process
against ``ring.layout_positions``.
"""
from __future__ import annotations

import torch

from ..harness import Graded
from .ring import layout_positions


def run(fn, case, i, spy) -> dict:
    s, c = case
    try:
        with spy.watch():
            got = fn(s, c)
    except ValueError as err:
        return {"raised": f"ValueError: {err}"[:300]}
    if isinstance(got, torch.Tensor):
        return {"value": got.detach().clone()}
    return {"value": repr(got)[:100]}


def grade(g: Graded) -> str | None:
    for i, (s, c) in enumerate(g.cases):
        (out,) = g.at(i)
        where = f"s={s}, c={c}"
        if s % (2 * c):
            if "raised" not in out:
                return (f"{g.name}({s}, {c}) returned {out['value']!r}; {s} is not a multiple of 2c = {2 * c}, "
                        "so raise a ValueError that says the length must be divisible by 2c (pad it).")
            said = out["raised"].split(":", 1)[1]  # what follows "ValueError:"
            if not ("divisible" in said or "multiple" in said) or str(s) not in said or str(2 * c) not in said:
                return (f"{g.name}({s}, {c}) raised {out['raised']!r}: right, but say what is wrong, with "
                        f"both numbers ('sequence length {s} is not divisible by 2c = {2 * c}').")
            continue
        if "raised" in out:
            return f"{g.name}({s}, {c}) raised {out['raised']} although {s} divides into {2 * c} chunks."
        want = layout_positions(s, c, "zigzag")
        got = out["value"]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else got
            return f"{g.name}({where}) returned {shape}; expected a LongTensor of shape {tuple(want.shape)}."
        if got.dtype != torch.long:
            return f"{g.name}({where}) returned dtype {got.dtype}; positions index tokens: use torch.long."
        if not torch.equal(got, want):
            if torch.equal(got, layout_positions(s, c, "contiguous")):
                return (f"{g.name}({where}) returned the plain contiguous split: with a causal mask the last "
                        "rank then does c times the first's work. Cut into 2c chunks; rank r takes chunks "
                        "r and 2c − 1 − r.")
            return (f"{g.name}({where}) returned {got.tolist()}; expected {want.tolist()} (2c chunks, rank r "
                    "holds chunk r then chunk 2c − 1 − r, each in increasing order).")
    return None


VISIBLE = ((1, ((8, 2), (12, 3), (10, 2))),)
HIDDEN = ((1, ((16, 4), (4, 1), (18, 3), (12, 4))),)
