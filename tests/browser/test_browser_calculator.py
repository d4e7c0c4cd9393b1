"""The strategy calculator in JupyterLab: its sliders draw, and a click redraws the memory and the verdict."""
from __future__ import annotations

import re

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect


def test_calculator_shows_the_best_plan_and_follows_a_click(open_notebook):
    nb = open_notebook("00-setup/00-setup.ipynb")
    cell = nb.add_cell('from parlab.calculator import calculator\ncalculator("7B on 8 H100s")')
    nb.run_and_wait(cell, timeout=120)
    out = nb.outputs(cell)
    expect(out.locator(".widget-slider").first).to_be_visible()
    expect(out.get_by_text("Best plan")).to_be_visible()
    expect(out.locator("img")).to_have_count(1)
    expect(out).to_contain_text("fits: 79.3 GB of 80 GB per GPU")  # tp=2, ZeRO-1 (parlab.planner)
    nb.screenshot("lab06-calculator", cell)

    out.locator(".widget-toggle-buttons button", has_text=re.compile(r"^0$")).click()  # ZeRO-0
    expect(out).to_contain_text("does not fit: 110.8 GB of 80 GB per GPU")
    expect(out).to_contain_text("over the 80 GB a GPU holds")
    out.get_by_text("Best plan").click()
    expect(out).to_contain_text("fits: 79.3 GB of 80 GB per GPU")
