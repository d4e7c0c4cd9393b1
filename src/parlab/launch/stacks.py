"""Turn faulthandler dumps and tracebacks into "where was each rank" text."""
from __future__ import annotations

import os
import re
import sysconfig

_FRAME = re.compile(r'File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)')
_TB_FILE = re.compile(r'File "(?P<file>[^"]*)", line (?P<line>\d+)')
_PARLAB_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the parlab package
_WORKER = os.path.join("parlab", "launch", "worker.py")
_TASKS = os.path.join("parlab", "launch", "tasks.py")
_LIB_DIRS = tuple(
    p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p
)


def label_cells(text: str, labels: dict) -> str:
    """Replace notebook cells' temporary file names with ``Cell In[n]``."""
    if not labels:
        return text

    def swap(m: re.Match) -> str:
        label = labels.get(m.group("file"))
        return f"{label}, line {m.group('line')}" if label else m.group(0)

    return _TB_FILE.sub(swap, text)


def _is_library(path: str) -> bool:
    return (path.startswith(_LIB_DIRS) or path.startswith(_PARLAB_DIR) or "site-packages" in path
            or path.startswith("<frozen"))


STARTING_UP = "still starting up (importing torch or what the task needs, or joining the process group)"


def _short(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return os.path.basename(path)


def main_thread_frames(dump: str) -> list[tuple[str, int, str]]:
    """Frames (file, line, function), innermost first, of the thread running the task.

    faulthandler prints one block per thread.  Our own helper threads (the
    parent watchdog) are skipped; the block that went through the worker's
    ``main`` is the one running the task.
    """
    blocks, current = [], None
    for line in dump.splitlines():
        if line.startswith(("Thread ", "Current thread ")):
            current = []
            blocks.append(current)
        elif current is not None:
            m = _FRAME.search(line)
            if m:
                current.append((m.group("file"), int(m.group("line")), m.group("func").strip()))
    for frames in blocks:
        if any(f.endswith(_WORKER) and fn == "main" for f, _, fn in frames):
            return frames
    return blocks[0] if blocks else []


def where(frames: list[tuple[str, int, str]], labels: dict) -> str:
    """One line: the innermost call and the user's line that led there."""
    if not frames:
        return "no Python stack (still starting up, or stuck outside Python)"

    def user_place(file: str, line: int, func: str) -> str:
        label = labels.get(file)
        return f"{label}, line {line} in {func}" if label else f"{_short(file)}:{line} in {func}"

    user = next((f for f in frames if f[0] in labels or not _is_library(f[0])), None)
    inner = frames[0]
    in_setup = any(f[0].endswith(_WORKER) and f[2] == "_prepare_rank" for f in frames)
    importing = any(f[0].startswith("<frozen importlib") for f in frames)
    if user is None and (in_setup or importing):
        return STARTING_UP
    # loading the task: the worker imports the modules it names (a test module, pytest) before running it
    in_worker = any(f[0].endswith(_WORKER) and f[2] == "main" for f in frames)
    if in_worker and importing and not any(f[0].endswith(_TASKS) for f in frames):
        return STARTING_UP
    if user is None:
        return f"in {inner[2]} ({_short(inner[0])}:{inner[1]})"
    if user == inner:
        return f"at {user_place(*user)}"
    # Skip thin wrappers (decorators) so the reader sees the torch call itself.
    named = next((f for f in frames if f[2] not in ("wrapper", "inner", "_fn")), inner)
    return f"in {named[2]} ({_short(named[0])}:{named[1]}), called from {user_place(*user)}"


def format_dump(dump: str, labels: dict) -> str:
    """The task thread's stack as traceback-style text, outermost call first."""
    outer_first = list(reversed(main_thread_frames(dump)))
    # Drop the launcher's own frames above the user's code: everything down to the worker's main
    # (a forked rank has the fork server's and torchrun's below it), then runpy and parlab's worker.
    starts = [i for i, (f, _, fn) in enumerate(outer_first) if f.endswith(_WORKER) and fn == "main"]
    if starts:
        del outer_first[:starts[0]]
    while outer_first and (outer_first[0][0].startswith(_PARLAB_DIR) or outer_first[0][0].startswith("<frozen")):
        outer_first.pop(0)
    lines = []
    for file, line, func in outer_first:
        label = labels.get(file)
        lines.append(f"  {label}, line {line}, in {func}" if label else f'  File "{file}", line {line}, in {func}')
    return "\n".join(lines)
