"""A figure cell of lab 01 renders an image in JupyterLab."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]
expect = pytest.importorskip("playwright.sync_api", reason="browser tier: playwright is not "
                             "installed (pip install -e '.[browser]')").expect


def test_collective_diagram_renders_an_image(open_notebook):
    nb = open_notebook("01-collectives/01-collectives.ipynb")
    nb.run_and_wait(nb.code_cell("%load_ext parlab"), timeout=120)

    figure = nb.code_cell('viz.collective_diagram("broadcast", n=4)')
    nb.run_and_wait(figure, timeout=120)
    image = nb.outputs(figure).locator("img")
    expect(image).to_have_count(1)
    expect(image).to_be_visible()
    image.scroll_into_view_if_needed()
    nb.screenshot("lab01-broadcast-figure", figure)
    natural = image.evaluate("img => [img.complete, img.naturalWidth, img.naturalHeight]")
    assert natural[0] and natural[1] > 100 and natural[2] > 50, f"image not decoded: {natural}"
    box = image.bounding_box()
    assert box and box["width"] > 100 and box["height"] > 50, f"image drawn at {box}"
