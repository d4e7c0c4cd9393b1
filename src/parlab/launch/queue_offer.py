"""A lab's optional "run this on the queue's GPUs" cell: run it, or say how to turn it on.

Labs 01 and 04 end a measurement with a cell that runs it again on 8 GPUs
through the Slurm queue (``slurm.py``).  ``offer_queue`` is that cell's
gate: it says yes when this kernel is set up for the queue
(``PARLAB_SCHEDULER=slurm``, read here and only here), and
otherwise prints one line saying how to turn it on, so that on a server
without a scheduler the cell changes nothing.  The variable routes no
launch by itself: the cell, once offered, passes ``scheduler="slurm"``, and
every other launch of the notebook stays local (``slurm.choose_scheduler``).

It also says no while nbgrader grades the notebook (``PARLAB_AUTOGRADE`` is
set): a class's submissions must not each queue an 8-GPU job; and while
nbgrader's Validate runs it (``PARLAB_VALIDATE`` is set): Validate runs the
notebook inside the server's request handler under the cell timeout, so a
queued job would fail right answers and hold the server until it ran.  The
hub's nbgrader configs set ``PARLAB_VALIDATE`` in the kernels Validate starts
(``hub/validate_config.py``).
"""
from __future__ import annotations

import os

from .slurm import choose_scheduler

#: Set by ``parlab.grading.autograde`` while nbgrader runs a submission (``grading.harness``).
_GRADING_ENV = "PARLAB_AUTOGRADE"
#: Set in the kernels nbgrader's Validate starts (``hub/validate_config.py``: the kernel's first line).
_VALIDATE_ENV = "PARLAB_VALIDATE"


def queue_configured() -> bool:
    """Whether this kernel is set up for the labs' queue cells: ``PARLAB_SCHEDULER=slurm``.

    A value other than "local" or "slurm" raises ``ValueError`` naming the variable.
    """
    return choose_scheduler(os.environ.get("PARLAB_SCHEDULER") or "local", "PARLAB_SCHEDULER") == "slurm"


def offer_queue(what: str, gpus: int) -> bool:
    """True when ``what`` should run now on ``gpus`` GPUs through the queue; else print why not.

    The one printed line names the variable to set.  Nothing is queued here:
    the caller launches with ``scheduler="slurm", gpus=gpus``.
    """
    if os.environ.get(_GRADING_ENV):
        print(f"parlab: {what} on {gpus} GPUs through the queue is not run while the notebook is graded.")
        return False
    if os.environ.get(_VALIDATE_ENV):
        print(f"parlab: {what} on {gpus} GPUs through the queue is not run while the notebook is validated.")
        return False
    if not queue_configured():
        print(f"parlab: no scheduler is configured, so {what} does not run on {gpus} GPUs through "
              "the queue. To turn it on, set PARLAB_SCHEDULER=slurm (and PARLAB_SLURM_PARTITION if "
              "your partition is not the default) before the kernel starts, or run "
              "os.environ['PARLAB_SCHEDULER'] = 'slurm' in a cell and run this cell again.")
        return False
    partition = os.environ.get("PARLAB_SLURM_PARTITION") or "the default partition"
    print(f"parlab: {what} goes to the Slurm queue for {gpus} GPUs ({partition}); the cell waits "
          "there until they are free.")
    return True
