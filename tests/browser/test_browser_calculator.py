"""The strategy calculator in JupyterLab: its sliders draw, and a click redraws the memory and the verdict."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from parlab import planner

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect


def _gb(plan, work):
    return f"{sum(planner.memory_breakdown(plan, work.model).values()) / 1e9:.1f} GB on the busiest GPU"


def test_calculator_shows_the_best_plan_and_follows_a_click(open_notebook):
    work = planner.SCENARIOS["7B on 8 H100s"]
    best = planner.search(work).plan
    assert best.zero != 0  # the click below must change the plan
    plain_dp = replace(best, zero=0)
    assert planner.problems(plain_dp, work)  # ZeRO-0 does not fit: the verdict must flip
    nb = open_notebook("00-setup/00-setup.ipynb")
    cell = nb.add_cell('from parlab.calculator import calculator\ncalculator("7B on 8 H100s")')
    nb.run_and_wait(cell, timeout=120)
    out = nb.outputs(cell)
    expect(out.locator(".widget-slider").first).to_be_visible()
    expect(out.get_by_text("Best plan")).to_be_visible()
    expect(out.locator("img")).to_have_count(1)
    expect(out).to_contain_text(f"fits: {_gb(best, work)}")  # the planner's choice
    nb.screenshot("lab06-calculator", cell)

    out.locator(".widget-toggle-buttons button", has_text=re.compile(r"^0$")).click()  # ZeRO-0
    expect(out).to_contain_text(f"does not fit: {_gb(plain_dp, work)}")
    expect(out).to_contain_text("a plan may use (90% of the 80 GB a GPU holds)")
    out.get_by_text("Best plan").click()
    expect(out).to_contain_text(f"fits: {_gb(best, work)}")
