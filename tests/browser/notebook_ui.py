"""Driving a JupyterLab notebook the way a student does: click, type, Shift+Enter.

Every wait here is on something the page shows (a prompt number, a kernel
status, an output element), never a fixed sleep.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

from playwright.sync_api import Locator, Page, expect

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "browser"
DONE_PROMPT = re.compile(r"^\[\d+\]:$")
RANK_LABEL = re.compile(r"^rank \d+$")


class Notebook:
    def __init__(self, page: Page):
        self.page = page

    # ------------------------------------------------------------ opening

    def wait_ready(self, timeout: float = 90) -> "Notebook":
        """Wait until the notebook shows its cells and its kernel says Idle."""
        page = self.page
        expect(page.locator(".jp-Notebook .jp-Cell").first).to_be_visible(timeout=timeout * 1000)
        status = page.locator(".jp-NotebookPanel-toolbar .jp-Notebook-ExecutionIndicator")
        expect(page.locator(".jp-NotebookPanel-toolbar .jp-Toolbar-kernelName")).to_contain_text(
            "Python", timeout=timeout * 1000)
        expect(status).to_have_attribute("data-status", "idle", timeout=timeout * 1000)
        return self

    # ------------------------------------------------------------ cells

    @property
    def cells(self) -> Locator:
        return self.page.locator(".jp-Notebook .jp-Cell")

    def code_cell(self, containing: str) -> Locator:
        """The one code cell whose source contains ``containing``."""
        found = self.page.locator(".jp-Notebook .jp-CodeCell").filter(
            has=self.page.locator(".jp-InputArea-editor", has_text=containing))
        expect(found).to_have_count(1)
        return found

    def select(self, cell: Locator) -> None:
        """Select ``cell`` in command mode, as a click on its left margin does."""
        cell.locator(".jp-InputPrompt").click()
        expect(cell).to_have_class(re.compile(r"\bjp-mod-selected\b"))

    def set_source(self, cell: Locator, code: str) -> None:
        """Replace the cell's text: click into it, select all, paste the new text."""
        cell.locator(".cm-content").click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(code)
        self.page.keyboard.press("Escape")

    def add_cell(self, code: str) -> Locator:
        """A code cell at the end holding ``code``: the empty one that Shift+Enter
        left there, or a new one inserted below the last cell."""
        count = self.cells.count()
        last = self.cells.nth(count - 1)  # by index: .last would follow later insertions
        empty = ("jp-CodeCell" in (last.get_attribute("class") or "")
                 and not last.locator(".cm-content").inner_text().strip())
        if not empty:
            self.select(last)
            self.page.keyboard.press("Escape")
            self.page.keyboard.press("b")  # insert below, in command mode
            expect(self.cells).to_have_count(count + 1)
            last = self.cells.nth(count)
        self.set_source(last, code)
        return last

    def run(self, cell: Locator) -> None:
        """Select ``cell`` and press Shift+Enter; returns once the kernel took it."""
        self.select(cell)
        self.page.keyboard.press("Shift+Enter")
        expect(cell.locator(".jp-InputPrompt")).not_to_have_text("[ ]:")

    def wait_done(self, cell: Locator, timeout: float = 120) -> float:
        """Wait until ``cell`` shows an execution number; return how long it took.

        Polls every 50 ms in the page, so the time is good to about 0.1 s
        (Playwright's expect() backs off to 1 s between looks).
        """
        start = time.monotonic()
        self.page.wait_for_function(
            "([prompt, done]) => new RegExp(done).test(prompt.textContent.trim())",
            arg=[cell.locator(".jp-InputPrompt").element_handle(), DONE_PROMPT.pattern], polling=50,
            timeout=timeout * 1000)
        return time.monotonic() - start

    def run_and_wait(self, cell: Locator, timeout: float = 120) -> Locator:
        self.run(cell)
        self.wait_done(cell, timeout)
        return cell

    def interrupt(self) -> None:
        """Press the toolbar's stop button (Interrupt the kernel)."""
        self.page.locator(
            ".jp-NotebookPanel-toolbar [data-command='notebook:interrupt-kernel']").click()

    # ------------------------------------------------------------ outputs

    @staticmethod
    def outputs(cell: Locator) -> Locator:
        return cell.locator(".jp-Cell-outputArea")

    @staticmethod
    def top_level(cell: Locator, mime: str) -> Locator:
        """The cell's own outputs of one MIME type, not those inside a rank's widget."""
        return cell.locator(f".jp-Cell-outputArea > .jp-OutputArea-child > "
                            f".jp-OutputArea-output[data-mime-type='{mime}']")

    @staticmethod
    def rank_labels(cell: Locator) -> Locator:
        """The visible "rank r" headings in the cell's output."""
        return Notebook.outputs(cell).get_by_text(RANK_LABEL).filter(visible=True)

    @staticmethod
    def printed(cell: Locator, line: str) -> Locator:
        """The output block that is exactly ``line`` (what one print() of it shows)."""
        return Notebook.outputs(cell).get_by_text(line, exact=True)

    @staticmethod
    def owning_ranks(cell: Locator, line: str) -> list[str]:
        """The "rank r" headings of the smallest output box that holds both ``line`` and a heading.

        A line a rank printed sits in that rank's box, so this is ``["rank r"]``;
        for a line outside every rank's box it is all the headings (or none).
        """
        return Notebook.printed(cell, line).evaluate(
            """(node, pattern) => {
                const heading = new RegExp(pattern);
                const headings = (box) => [...box.querySelectorAll('*')]
                    .filter(e => e.children.length === 0 && heading.test(e.textContent.trim()))
                    .map(e => e.textContent.trim());
                for (let box = node.parentElement; box; box = box.parentElement) {
                    if (box.classList.contains('jp-Cell-outputArea')) return headings(box);
                    const found = headings(box);
                    if (found.length) return found;
                }
                return [];
            }""", RANK_LABEL.pattern)

    def screenshot(self, name: str, cell: Locator | None = None) -> Path:
        """Save a PNG of the page (scrolled to ``cell``) under test-artifacts/browser/."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        if cell is not None:
            cell.scroll_into_view_if_needed()
        self.page.screenshot(path=str(path))
        return path
