"""Grade a whole class: ``parlab grade LAB [--workers N] [--resume]``.

nbgrader's gradebook is one SQLite file, and concurrent ``nbgrader
autograde`` runs on it lose work (``benchmarks/gradebook_concurrency.py``
measures it; nbgrader's FAQ says sqlite "is not threadsafe" and that
parallel autograding is not supported).  So each submission is graded by a
worker process of its own in a copy of the course (``worker``) under the
course's ``.parlab-grade/`` folder, and the scheduler (``run``) alone
merges each finished submission into the real gradebook and the
``autograded/`` and ``feedback/`` folders (``merge``).  ``inputs`` finds the
submissions and turns bad ones away with a message each; ``report`` prints
the progress and the summary table; ``plan`` is what both schedulers share
(what to grade, what a killed run left), ``processes`` starts and ends one
worker with everything it started, ``cli`` is the command line.

``parlab grade LAB --slurm`` grades the same copies as one Slurm array job
(``array``: the submitting side and its one writer; ``array_slurm``: sbatch,
squeue and scancel; ``task``: what each array task runs on its node).
"""
