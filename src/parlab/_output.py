"""Where the ranks' output goes: one widget per rank in JupyterLab, text elsewhere.

Output is bounded: each rank may show ``per_rank`` lines, the first ones live
and the last few at the end, with a count of what was left out in between.
nbgrader keeps only 1000 lines per cell, so 8 chatty ranks must not flood it.
"""
from __future__ import annotations

import collections
import os
import sys

MAX_LINE_CHARS = 1000
TRUNCATE_BYTES = 32 * 2**20


def total_line_budget() -> int:
    return int(os.environ.get("PARLAB_MAX_LINES", "400"))


def widgets_wanted() -> bool:
    """True in a live Jupyter front end that can draw widgets.

    Jupyter Server sets JPY_SESSION_NAME for the kernels it starts; nbclient
    and nbgrader (headless) do not, and a plain script has no IPython at all.
    PARLAB_OUTPUT=text|widgets overrides the guess.
    """
    choice = os.environ.get("PARLAB_OUTPUT", "auto")
    if choice != "auto":
        return choice == "widgets"
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    if ip is None or type(ip).__name__ != "ZMQInteractiveShell":
        return False
    if "JPY_SESSION_NAME" not in os.environ:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class _RankBudget:
    """Head lines go out live; once the head is used up we keep only a tail."""

    def __init__(self, limit: int):
        self.head_left = max(1, limit - limit // 4)
        self.tail = collections.deque(maxlen=max(1, limit // 4))
        self.dropped = 0

    def take(self, item) -> bool:
        if self.head_left > 0:
            self.head_left -= 1
            return True
        if len(self.tail) == self.tail.maxlen:
            self.dropped += 1
        self.tail.append(item)
        return False


class OutputSink:
    def __init__(self, nproc: int):
        per_rank = max(10, total_line_budget() // max(1, nproc))
        self.budgets = [_RankBudget(per_rank) for _ in range(nproc)]

    def line(self, rank: int, stream: str, text: str) -> None:
        if "\r" in text:  # a progress bar redraws its line: keep what it drew last
            text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f" ... [{len(text) - MAX_LINE_CHARS} more characters]"
        if self.budgets[rank].take((stream, text)):
            self.write(rank, stream, text)

    def finish(self) -> None:
        for rank, budget in enumerate(self.budgets):
            if budget.dropped:
                self.write(rank, "err", f"... {budget.dropped} lines from rank {rank} not shown ...")
            for stream, text in budget.tail:
                self.write(rank, stream, text)
            budget.tail.clear()

    def write(self, rank: int, stream: str, text: str) -> None:
        raise NotImplementedError


class TextSink(OutputSink):
    """``[rank 1] hello`` lines on the notebook's stdout / stderr."""

    def write(self, rank: int, stream: str, text: str) -> None:
        target = sys.stderr if stream == "err" else sys.stdout
        target.write(f"[rank {rank}] {text}\n")
        target.flush()


class WidgetSink(OutputSink):
    """One scrolling output area per rank, side by side."""

    def __init__(self, nproc: int):
        super().__init__(nproc)
        import ipywidgets as w
        from IPython.display import display

        self.areas = [
            w.Output(layout=w.Layout(max_height="220px", overflow="auto", border="1px solid #ccc"))
            for _ in range(nproc)
        ]
        columns = min(nproc, 4)
        boxes = [w.VBox([w.HTML(f"<b>rank {r}</b>"), area]) for r, area in enumerate(self.areas)]
        display(w.GridBox(boxes, layout=w.Layout(grid_template_columns=f"repeat({columns}, 1fr)")))

    def write(self, rank: int, stream: str, text: str) -> None:
        if stream == "err":
            self.areas[rank].append_stderr(text + "\n")
        else:
            self.areas[rank].append_stdout(text + "\n")


def make_sink(nproc: int) -> OutputSink:
    return WidgetSink(nproc) if widgets_wanted() else TextSink(nproc)


class FileTail:
    """Reads the new complete lines of a file that another process appends to."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.partial = b""

    def read_lines(self, final: bool = False) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(data)
        if self.offset > TRUNCATE_BYTES:
            # A rank printing in a loop must not fill the disk: drop what was
            # read (the budget already hides it) and keep appending from zero.
            os.truncate(self.path, 0)
            self.offset = 0
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [ln.decode("utf-8", "replace").rstrip("\r") for ln in lines]
