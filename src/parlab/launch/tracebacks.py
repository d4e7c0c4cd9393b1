"""Students see their cell and the rank's traceback, not the launcher's frames.

IPython hides frames marked ``__tracebackhide__``, except the last one: the
frame that raised.  A launch error is raised inside ``parlab.launch``, so
that frame would still show.  In an IPython kernel, ``install()`` registers a
handler for parlab's errors and for KeyboardInterrupt that cuts the
traceback at the first frame inside ``parlab/launch/`` and then shows it the
usual way.  A traceback with no launcher frame is shown unchanged.  Nothing
is installed outside IPython, or when another custom handler is already set.
"""
from __future__ import annotations

import os

_HERE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def bare(exc: BaseException) -> BaseException:
    """``exc`` without the launcher's frames, to be raised from a public function.

    IPython hides frames marked ``__tracebackhide__`` but always shows the one
    that raised; raising again from the public function leaves only the
    student's cell and that one line.
    """
    return exc.with_traceback(None)


def without_launcher_frames(tb):
    """``tb`` cut just before its first frame inside parlab/launch (the same object, shortened)."""
    previous, entry = None, tb
    while entry is not None:
        if entry.tb_frame.f_code.co_filename.startswith(_HERE):
            if previous is None:
                return tb
            previous.tb_next = None
            return tb
        previous, entry = entry, entry.tb_next
    return tb


def _show(shell, etype, value, tb, tb_offset=None):
    shell.showtraceback((etype, value, without_launcher_frames(tb)), tb_offset=tb_offset,
                        running_compiled_code=True)
    return []


def install() -> bool:
    """Register the handler in the running IPython shell; True when it was registered."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or shell.custom_exceptions:
        return False
    from .errors import LaunchError

    shell.set_custom_exc((LaunchError, KeyboardInterrupt), _show)
    return True
