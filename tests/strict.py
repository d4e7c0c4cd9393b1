"""Launches under the strict-device spy (strict_device/sitecustomize.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

SPY_DIR = Path(__file__).resolve().parent / "strict_device"


@pytest.fixture
def strict_ranks(monkeypatch):
    """Ranks launched while this fixture is active refuse tensors off parlab.device() in collectives."""
    monkeypatch.setenv("PARLAB_STRICT_DEVICE", "1")
    path = [str(SPY_DIR)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))


def wrong_device_then_right(wrong: str):
    """On a rank: all_reduce a tensor on ``wrong`` (the spy must refuse it), then one on the rank's device."""
    import torch
    import torch.distributed as dist

    import parlab

    try:
        dist.all_reduce(torch.ones(1, device=wrong))
        refused = None
    except RuntimeError as err:
        refused = str(err)
    t = torch.ones(1, device=parlab.device()) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return refused, t.item(), str(parlab.device()), dist.get_backend()
