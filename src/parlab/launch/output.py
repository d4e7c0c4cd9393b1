"""Where the ranks' output goes: one widget per rank in JupyterLab, text elsewhere.

Everything here runs on the kernel's main thread: the job's watch loop reads
the rank files and calls the sink, and no thread of parlab's ever writes to
IPython's display, comm or zmq machinery.

Output is bounded: each rank may show ``per_rank`` lines, the first ones live
and the last few at the end, with a count of what was left out in between.
nbgrader keeps only 1000 lines per cell, so 8 chatty ranks must not flood it.
"""
from __future__ import annotations

import collections
import html
import os
import sys

from ..plainfile import NotPlainFile, open_plain, read_plain

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
    """Receives the ranks' lines, the launcher's notices and progress, all on the kernel's main thread."""

    #: seconds before the first progress report, and between two of them
    progress_after, progress_every = 10.0, 1.0

    def __init__(self, nproc: int):
        per_rank = max(10, total_line_budget() // max(1, nproc))
        self.budgets = [_RankBudget(per_rank) for _ in range(nproc)]
        self.nproc = nproc
        self._next_progress = self.progress_after

    def line(self, rank: int, stream: str, text: str) -> None:
        if "\r" in text:  # a progress bar redraws its line: keep what it drew last
            text = next((part for part in reversed(text.split("\r")) if part.strip()), "")
        if len(text) > MAX_LINE_CHARS:
            text = text[:MAX_LINE_CHARS] + f" ... [{len(text) - MAX_LINE_CHARS} more characters]"
        if self.budgets[rank].take((stream, text)):
            self.write(rank, stream, text)

    def progress(self, elapsed: float, finished: list[int]) -> None:
        """Called every poll; reports at most every ``progress_every`` s once past ``progress_after``."""
        if elapsed < self._next_progress:
            return
        self._next_progress = elapsed + self.progress_every
        waiting = [r for r in range(self.nproc) if r not in finished]
        done = f"rank(s) {_ranks(finished)} finished" if finished else "no rank finished yet"
        rest = f"waiting for {_ranks(waiting)}" if waiting else "ending the launch"
        self.show_progress(f"parlab: {elapsed:.0f} s, {done}; {rest}")

    def finish(self, elapsed: float | None = None) -> None:
        for rank, budget in enumerate(self.budgets):
            if budget.dropped:
                self.write(rank, "notice", f"... {budget.dropped} lines from rank {rank} not shown ...")
            for stream, text in budget.tail:
                self.write(rank, stream, text)
            budget.tail.clear()

    def write(self, rank: int, stream: str, text: str) -> None:
        raise NotImplementedError

    def notice(self, text: str, error: bool = False) -> None:
        """A message from the launcher itself; only ``error`` ones go to stderr."""
        target = sys.stderr if error else sys.stdout
        target.write(text + "\n")
        target.flush()

    def show_progress(self, text: str) -> None:
        raise NotImplementedError


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 8 else f"{len(ranks)} ranks"


class TextSink(OutputSink):
    """``[rank 1] hello`` lines, all on the kernel's stdout.

    Headless runs (nbclient, nbgrader) score a cell with any stderr output as
    failed, so a rank's stderr (warnings, say) is relayed to stdout as
    ``[rank 1 stderr] ...``; only errors raised in the kernel reach stderr.
    """

    progress_after = progress_every = 30.0

    def write(self, rank: int, stream: str, text: str) -> None:
        tag = f"[rank {rank} stderr]" if stream == "err" else f"[rank {rank}]"
        sys.stdout.write(f"{tag} {text}\n")
        sys.stdout.flush()

    def show_progress(self, text: str) -> None:
        self.notice(text)


class WidgetSink(OutputSink):
    """One scrolling output area per rank, side by side, shown once that rank prints.

    Everything lives in one box, displayed the first time there is something
    to show (a rank's line or the progress line), so a quiet launch draws
    nothing and the kernel's own later output lands below the box.

    The widget tree is built whole at that first moment, one hidden area per
    rank, and never rebuilt: a rank's first line only unhides its area.
    Re-assigning a box's ``children`` while lines stream in makes the front end
    remove and re-create views of the same Output widget; a grid rebuilt that
    way once showed a rank's line twice in JupyterLab.
    """

    def __init__(self, nproc: int):
        super().__init__(nproc)
        self.areas = []  # rank -> its Output widget, once the box exists
        self.cells = []  # rank -> the (heading, area) box, hidden until that rank prints
        self.box = self.status = None

    def _show(self) -> None:
        if self.box is not None:
            return
        import ipywidgets as w
        from IPython.display import display

        self.areas = [w.Output(layout=w.Layout(max_height="220px", overflow="auto", border="1px solid #ccc"))
                      for _ in range(self.nproc)]
        self.cells = [w.VBox([w.HTML(f"<b>rank {rank}</b>"), area], layout=w.Layout(display="none"))
                      for rank, area in enumerate(self.areas)]
        columns = min(self.nproc, 4)
        grid = w.GridBox(self.cells, layout=w.Layout(grid_template_columns=f"repeat({columns}, 1fr)"))
        self.status = w.HTML(layout=w.Layout(display="none"))  # shown by the first progress line
        self.box = w.VBox([grid, self.status], layout=w.Layout(margin="0 0 6px 0"))
        display(self.box)

    def _area(self, rank: int):
        self._show()
        self.cells[rank].layout.display = None  # traitlets sends nothing once it is shown
        return self.areas[rank]

    def write(self, rank: int, stream: str, text: str) -> None:
        area = self._area(rank)
        if stream in ("out", "notice"):
            area.append_stdout(text + "\n")
        else:
            area.append_stderr(text + "\n")

    def show_progress(self, text: str) -> None:
        self._show()
        self.status.value = f"<i>{html.escape(text)}</i>"
        self.status.layout.display = None

    def finish(self, elapsed: float | None = None) -> None:
        super().finish(elapsed)
        if self.status is not None and self.status.layout.display != "none" and elapsed is not None:
            self.status.value = f"<i>parlab: finished after {elapsed:.0f} s</i>"


def make_sink(nproc: int) -> OutputSink:
    """Widgets in a live JupyterLab, text elsewhere.

    Only the main thread may touch the kernel's display and comm machinery,
    so a launch started from another thread gets plain text.
    """
    import threading

    if widgets_wanted() and threading.current_thread() is threading.main_thread():
        return WidgetSink(nproc)
    return TextSink(nproc)


class FileTail:
    """Reads the new complete lines of a file that another process appends to."""

    def __init__(self, path: str):
        self.path = path
        self.offset = 0
        self.partial = b""

    def _truncate(self) -> bool:
        """Empty the file (the file itself, never a link's target); False if it is not a plain file."""
        try:
            fd = open_plain(self.path, write=True)
        except OSError:
            return False
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        return True

    def read_lines(self, final: bool = False) -> list[str]:
        try:  # never through a link or from a FIFO a rank put in its place (parlab.plainfile)
            data = read_plain(self.path, self.offset)
        except (FileNotFoundError, NotPlainFile):
            return []
        self.offset += len(data)
        if self.offset > TRUNCATE_BYTES and self._truncate():
            # A rank printing in a loop must not fill the disk: drop what was
            # read (the budget already hides it) and keep appending from zero.
            self.offset = 0
        data = self.partial + data
        lines = data.split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [ln.decode("utf-8", "replace").rstrip("\r") for ln in lines]
