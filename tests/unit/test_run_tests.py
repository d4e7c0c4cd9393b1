"""``make test``'s two lanes (scripts/run_tests.py) hold every tier once."""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.unit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import run_tests  # noqa: E402


def test_every_tier_runs_in_exactly_one_lane():
    run_tests.check_lanes(run_tests._tiers())


@pytest.mark.parametrize("lanes", [
    {"a": ("nbgrader", "slurm"), "b": ("ranks", "unit", "hub", "browser")},            # gpu left out
    {"a": ("nbgrader", "unit", "slurm", "gpu"), "b": ("ranks", "hub", "browser", "gpu")},  # gpu twice
    {"a": ("nbgrader", "unit", "slurm", "gpu"), "b": ("ranks", "hub", "browser", "web")},  # no such tier
])
def test_a_lane_table_that_drops_doubles_or_invents_a_tier_is_refused(monkeypatch, lanes):
    monkeypatch.setattr(run_tests, "LANES", lanes)
    with pytest.raises(SystemExit, match="every tier"):
        run_tests.check_lanes(run_tests._tiers())
