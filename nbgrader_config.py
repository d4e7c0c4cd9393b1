"""nbgrader configuration for the parlab course (nbgrader 0.9.6).

Run nbgrader from the repository root so that it picks up this file:

    nbgrader generate_assignment 00-setup --force   # or: make release (all labs)
    nbgrader autograde 00-setup                     # after collecting submissions

Layout (one folder per lab, one notebook per folder):

    solutions/<lab>/<lab>.ipynb          instructor version: solutions + hidden tests
    labs/<lab>/<lab>.ipynb               student version, GENERATED from solutions/
    submitted/<student>/<lab>/...        collected work           (git-ignored)
    autograded/, feedback/, gradebook.db nbgrader's grading state (git-ignored)

Every setting below is one the course relies on; anything not set keeps
nbgrader's default.  See docs/instructor.md for the workflow.
"""

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

# ---------------------------------------------------------------- course layout
# Course id used by the JupyterHub exchange (release_assignment / collect).
c.CourseDirectory.course_id = "parlab"
# The instructor notebooks live in solutions/ (nbgrader's "source" step) ...
c.CourseDirectory.source_directory = "solutions"
# ... and the student notebooks are generated into labs/ (the "release" step).
# labs/ is committed so that students who simply clone the repository get the
# lab notebooks; it is never edited by hand (scripts/release.py rewrites it).
c.CourseDirectory.release_directory = "labs"
# The gradebook is nbgrader's default: sqlite:///<root>/gradebook.db, which is
# git-ignored.  (CourseDirectory.db_students / db_assignments no longer exist
# in nbgrader 0.9; students are added by `nbgrader db student add` or created
# on the fly by `nbgrader autograde`, which creates missing students by default.)

# ---------------------------------------------------------------- executing cells
# Seconds one cell may run during autograde before nbgrader interrupts it.
# nbgrader's default (30 s) is too short: a cold 4-rank launch alone costs
# about 10 s on a 2-core machine, and a test cell may launch 2-3 times.
# It must also stay ABOVE parlab's own launch timeout (parlab.launch.
# DEFAULT_TIMEOUT = 120 s): then a deadlocked student cell ends as a clean
# parlab.LaunchTimeout, with every rank's stack and all processes ended,
# instead of nbgrader interrupting the kernel while ranks are still running.
c.Execute.timeout = 300
# On a cell timeout, interrupt the kernel and record the cell as failed
# rather than aborting the whole notebook (this is nbgrader's default, kept
# on purpose: the remaining exercises still get graded).
c.Execute.interrupt_on_timeout = True

# ---------------------------------------------------------------- grading that a submission cannot subvert
# parlab's execute step (parlab/grading/autograde/execute.py) replaces nbgrader's: it
# grades each test cell's checks in a fresh process instead of in the
# student's kernel (where an earlier cell may have replaced a check, parlab,
# torch or a builtin), and when a cell kills the kernel it records that
# cell's error, restarts the kernel, replays the cells above and goes on, so
# the other exercises are still scored.  InertOutputs (parlab/grading/autograde/inert_outputs.py),
# right after it, leaves nothing in the autograded notebook that could run where it is shown (see
# "No live HTML from a submission" below).  The rest of the list is nbgrader's default autograde
# pipeline, unchanged.
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata,  # noqa: E402
                                    IgnorePattern, LimitOutput, SaveAutoGrades)

from parlab.grading.autograde import GuardedExecute, InertOutputs  # noqa: E402

c.Autograde.autograde_preprocessors = [
    GuardedExecute, InertOutputs, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata,
]
# The student's kernel and the ranks that run its answers are untrusted: each runs inside a
# bubblewrap box of the submission (parlab/grading/boundary.py): code and environment read-only, the
# course root (solutions/, submitted/, the gradebook), $HOME and /tmp hidden, a bounded scratch copy of
# the submission, loopback only, an environment without tokens, and, per submission, these bounds
# (reaching one costs that submission's cell, with a note naming the bound).  nbgrader and parlab's
# grader stay outside the boxes.  Without bwrap grading refuses to start (apt-get install bubblewrap);
# boundary = False runs notebooks as you, for trusted notebooks only.  See docs/instructor.md.
c.GuardedExecute.boundary = True
c.GuardedExecute.box_memory_mb = 6144    # memory of one submission (cgroup; else RLIMIT_AS per process)
c.GuardedExecute.box_processes = 1024    # processes and threads of one submission
c.GuardedExecute.box_scratch_mb = 512    # each writable folder (the scratch copy, /tmp)
# A test cell the student deleted is put back (and graded), instead of being
# left for manual grading where it could be given points.
c.OverwriteCells.add_missing_cells = True

# ---------------------------------------------------------------- no live HTML from a submission
# The feedback HTML (generate_feedback, parlab grade) and the formgrader's page of a submission are made
# from the autograded notebook; the formgrader's page is served by the instructor's own Jupyter server,
# where a student's script would act as the instructor (the contents API can write the course).  So:
# InertOutputs (above) keeps only text/plain, PNG and JPEG in every display output and shows a markdown
# cell holding anything but inert HTML as text, in the stored notebook itself; and both pages escape
# scripts when they render (nbconvert's bleach sanitizer on text/html and markdown outputs, no
# application/javascript).  The formgrader reads this setting from this file (the course root's config).
# nbgrader's feedback and formgrade templates render markdown cells without the sanitizer, which is why
# InertOutputs reads the markdown too.
c.HTMLExporter.sanitize_html = True

# ---------------------------------------------------------------- output limits
# nbgrader keeps at most this many lines of stream output and traceback per
# cell in the autograded notebook (these are its defaults, written out so the
# numbers the course documents are visible here).  parlab bounds each rank's
# printed output on its side (PARLAB_MAX_LINES), so a chatty rank cannot
# flood the gradebook.
c.LimitOutput.max_lines = 1000
c.LimitOutput.max_traceback = 100

# ---------------------------------------------------------------- solution stubs
# Release version of a solution region: the student sees this and replaces it.
# (nbgrader's default text, written out because the course's tests check that
# every answer cell of a released lab raises NotImplementedError.)
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"
