"""What lab 03's rules and hints read from a rank's spy record.

A record holds the collectives the rank made (``calls``: each with its
``op``, its ``numel`` and whether it ran ``in_backward``) and the events
the runner noted (``events``: "built", "uneven", "layer_norm").
"""
from __future__ import annotations

#: The names an all-gather and a reduce-scatter go by in ``torch.distributed``.
GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")
SCATTERS = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single")


def calls(rec: dict, backward: bool) -> list[dict]:
    """The collectives made in backward (True) or in forward (False)."""
    return [c for c in rec["calls"] if c["in_backward"] == backward]


def event(rec: dict, name: str) -> dict | None:
    """The first event of that name the runner noted, or None."""
    return next((e for e in rec["events"] if e["event"] == name), None)
