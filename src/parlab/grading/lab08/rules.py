"""Lab 08: the rule exercises 1 and 2 share: ranks agree with one small collective, never the gradients."""
from __future__ import annotations

from .. import records as read


def one_small_collective(rec: dict, calls: list[dict], r: int, n: int, where: str, what: str) -> str | None:
    """What is wrong with ``calls`` (rank ``r``'s, ``where``): more than one, or one of more than n elements.

    ``what`` names the number each rank should send ("a flag", "this rank's sum of squares").
    """
    if len(calls) > 1:
        return (f"rank {r} made {len(calls)} torch.distributed calls{where} "
                f"({', '.join(c['op'] for c in calls)}); one collective on {what} is enough.")
    big = [c for c in calls if (c.get("numel") or 0) > n]
    if big:
        return (f"rank {r} sent {read.describe(rec, big[0])}{where}: more than one number per rank. "
                f"Send {what} only, not the gradients.")
    return None
