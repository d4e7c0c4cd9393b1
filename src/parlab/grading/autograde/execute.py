"""nbgrader's execute step, hardened for parlab's labs.

``nbgrader_config.py`` puts ``GuardedExecute`` in place of nbgrader's
``Execute``.  It runs a submission's cells in its kernel as usual, with two
changes:

**Test cells are graded outside the kernel.**  nbgrader restores a test
cell's source but runs it in the student's kernel, where an earlier cell
may have replaced the check, ``parlab``, torch or a builtin.  So while a
submission is graded, the checks in the kernel only say that they were
recorded (``PARLAB_AUTOGRADE`` is set).  After each graded test cell this
preprocessor reads the ``labNN.check_x(answer, hidden=...)`` calls from
the restored source and has the kernel pickle each ``answer`` by value into
a file, right then.  Once the notebook has run, one
``python -m parlab.grading.autograde.sandbox`` process grades every test cell's
answers: a fresh process that imports the checks itself, unpickles the
answers only on the ranks (answers that need the same world size share a
launch, see ``parlab.grading.autograde.shared_launches``), and takes back only plain
data.  Each test cell's outputs are replaced by what
the sandbox printed for it, and an ``AssertionError`` when its answer failed.
(One sandbox for the whole notebook, not one per cell, saves a process
start-up and ``import torch`` per test cell.)
Whatever the kernel did to itself, it cannot change that verdict; at most
it can hand in a different answer, which is then what gets graded.

**The student's code runs inside an operating-system boundary.**  The
kernel (started through ``BoxedKernelManager``) and the sandbox's ranks
(through the launcher's ``WRAPPER_ENV``) each run in a bubblewrap box of
the submission (``parlab.grading.boundary``): read-only code, a bounded
scratch copy of the submission, no course root, home or network beyond
loopback, a cleared environment, and bounded memory, processes and disk.
The kernel talks to nbgrader over ZeroMQ ``ipc`` sockets in a folder bound
into its box (it has no network to reach a TCP port outside).  nbgrader,
this preprocessor and the sandbox process stay outside, so the gradebook and
the verdicts are out of the student's reach; answers leave the kernel's box
as files of bytes in its hand-in folder, verdicts leave the ranks' box as
plain data.  A cell that reaches a bound gets a note naming it.  Without
``bwrap`` grading refuses to start, saying how to install it
(``GuardedExecute.boundary = False`` turns the boundary off, for trusted
notebooks only).

**A cell that kills the kernel costs only its own points.**  nbgrader 0.9
gives up on a whole submission when the kernel dies (``os._exit``, running
out of memory).  Here the death is recorded as that cell's error, the kernel
is restarted, the cells before it are replayed (skipping any that kill it
again) and grading goes on, so the other exercises are still scored.
"""
from __future__ import annotations

import ast
import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import DeadKernelError
from nbclient.util import run_sync
from nbformat import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Integer

from ...launch.job import WRAPPER_ENV
from ...plainfile import NotPlainFile, open_plain, unsafe_entry
from ..boundary import WORKDIR_PREFIX, Box, Limits
from ..harness import AUTOGRADE_ENV

_LAB = re.compile(r"lab\d\d")


def graded_calls(source: str) -> list[dict]:
    """The ``labNN.check_x(expr, hidden=...)`` calls in a test cell, in order.

    Each is ``{"lab", "check", "answer" (the argument's source), "hidden"}``.
    Only this shape is recognised; anything else in the cell is ignored.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    calls = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and _LAB.fullmatch(node.func.value.id)
                and node.func.attr.startswith("check_") and node.args):
            continue
        hidden = any(k.arg == "hidden" and isinstance(k.value, ast.Constant) and k.value.value is True
                     for k in node.keywords)
        calls.append({"lab": node.func.value.id, "check": node.func.attr,
                      "answer": ast.get_source_segment(source, node.args[0]), "hidden": hidden,
                      "line": node.lineno})
    return sorted(calls, key=lambda c: c["line"])


def _is_test_cell(cell) -> bool:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution")


def _error(ename: str, message: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=message,
                        traceback=[f"{ename}: {message}"])


def _stdout(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=text)


class UnsafeSubmission(RuntimeError):
    """The submitted folder holds something other than plain files and folders (the message names it)."""


class BoxedKernelManager(AsyncKernelManager):
    """A kernel started inside the submission's box, reached over ``ipc`` sockets in the box's folder."""

    box: Box | None = None

    def use_box(self, box: Box) -> None:
        self.box = box
        self.transport = "ipc"  # the box has no network of ours: Unix sockets in a folder bound into it
        self.ip = str(box.ipc / "kernel")
        self.connection_file = str(box.ipc / "kernel.json")

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        if self.box is None:  # GuardedExecute.boundary = False: nbgrader's own kernel
            return cmd
        # a signal to the outer process would not reach the kernel inside: ask it by message
        self.kernel_spec.interrupt_mode = "message"
        return self.box.command("kernel") + cmd


def _note(text: str) -> NotebookNode:
    return NotebookNode(output_type="stream", name="stdout", text=f"parlab: {text}\n")


class GuardedExecute(Execute):
    """nbgrader's Execute with boxed, sandboxed test cells and kernel-death recovery."""

    boundary = Bool(True, help="Run the kernel and the grading ranks inside an operating-system boundary "
                    "(bubblewrap; see parlab.grading.boundary). Turn off only for trusted notebooks.").tag(config=True)
    box_memory_mb = Integer(Limits.memory_bytes >> 20, help="Memory of one submission, MiB").tag(config=True)
    box_processes = Integer(Limits.processes, help="Processes of one submission").tag(config=True)
    box_scratch_mb = Integer(Limits.scratch_bytes >> 20,
                             help="Each writable folder of one submission (scratch copy, /tmp), MiB").tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", BoxedKernelManager)
        super().__init__(*args, **kwargs)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        if self._box is not None:
            km.use_box(self._box)
        return km

    def _limits(self) -> Limits:
        return Limits(self.box_memory_mb << 20, self.box_processes, self.box_scratch_mb << 20)

    def _refuse_unsafe_submission(self, resources) -> None:
        """Under ``nbgrader autograde``: refuse a submitted folder holding a link, FIFO, socket, device or hard link.

        nbgrader has already copied its other files into ``autograded/``
        (through any link); failing here, before a kernel starts, makes
        nbgrader remove that folder and grade nothing of the submission.
        ``parlab grade`` refuses such a folder before it copies anything.
        """
        info = (resources or {}).get("nbgrader", {})
        if not (info.get("student") and info.get("assignment")):
            return  # not run by an nbgrader converter
        coursedir = getattr(getattr(self.parent, "parent", None), "coursedir", None)
        if coursedir is None:
            from nbgrader.coursedir import CourseDirectory

            coursedir = CourseDirectory(config=self.config)
        folder = Path(coursedir.format_path(coursedir.submitted_directory, info["student"], info["assignment"]))
        problem = unsafe_entry(folder, folder.parent.parent) if folder.is_dir() else None
        if problem:
            self.log.error("parlab: %s", problem)
            raise UnsafeSubmission(problem)

    def preprocess(self, nb, resources=None, km=None):
        self._refuse_unsafe_submission(resources)
        self._workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
        self._killers: set[int] = set()
        self._pending: list[tuple[int, list[dict]]] = []  # test cells whose answers were handed in
        self._box = None
        saved = os.environ.get(AUTOGRADE_ENV)
        try:
            if self.boundary:
                where = (resources or {}).get("metadata", {}).get("path") or os.getcwd()
                self._box = Box(self._workdir, where, self._limits())
                self.log.info("parlab: this submission's boxes run as uid %d", self._box.uid)
                if os.geteuid() == 0 and not self._box.mounted:
                    self.log.warning("parlab: the folder this submission's boxes write for the grader could "
                                     "not be mounted as a tmpfs of its own (%s): only each file it writes is "
                                     "bounded", self._box.dir)
                if self._box.limits.memory_bytes < self._box.asked_memory:
                    self.log.warning("parlab: this submission's memory bound is %s, not box_memory_mb = %d: the "
                                     "cgroup around the grader (a Slurm task's --mem) leaves no more beside it",
                                     self._box.limits.describe()["memory"], self.box_memory_mb)
            else:
                self.log.warning("parlab: grading WITHOUT the operating-system boundary "
                                 "(GuardedExecute.boundary = False): the notebook's code runs as you")
            handin = str(self._box.handin) if self._box else self._workdir
            os.environ[AUTOGRADE_ENV] = handin  # inherited by the kernel it starts
            nb, resources = super().preprocess(nb, resources, km)
            self._grade_pending(nb)
            return nb, resources
        finally:
            if saved is None:
                os.environ.pop(AUTOGRADE_ENV, None)
            else:
                os.environ[AUTOGRADE_ENV] = saved
            if self._box is not None:
                self._box.close()
            shutil.rmtree(self._workdir, ignore_errors=True)

    def preprocess_cell(self, cell, resources, index):
        self._check_assign_resources(resources)
        try:
            cell = self.execute_cell(cell, index, store_history=True)
        except DeadKernelError:
            self._killers.add(index)
            cell.outputs.append(_error(
                "KernelDied", "the kernel died while running this cell (os._exit, a crash, or out "
                "of memory). The kernel was restarted and the cells above were run again, so the "
                "rest of the notebook is still graded."))
            self._note_bounds(cell)
            self._restart_and_replay(index)
            return cell, self.resources
        self._note_bounds(cell)
        if _is_test_cell(cell):
            calls = graded_calls(cell.source)
            if calls:
                problem = self._hand_in(calls, index)
                cell.outputs = [_error("AssertionError", problem)] if problem else []
                if not problem:
                    self._pending.append((index, calls))  # graded once the notebook has run
                # nbclient's execute_cell stores the cell it ran at nb.cells[index]: the
                # hand-in probes replaced this test cell there, so put it back.
                self.nb.cells[index] = cell
        return cell, self.resources

    def _note_bounds(self, cell) -> None:
        """Say which of the submission's bounds the cell reached, if any."""
        notes = []
        if self._box is not None:
            notes += [f"this cell reached the submission's bound on {what}" for what in self._box.bounds_hit()]
            errors = " ".join(str(o.get("evalue", "")) + " ".join(o.get("traceback", []))
                              for o in cell.get("outputs", []) if o.get("output_type") == "error")
            if "No space left on device" in errors or "Disk quota exceeded" in errors:
                notes.append(f"the submission's writable folders hold at most {self.box_scratch_mb} MiB each")
            if "MemoryError" in errors:
                notes.append(f"the submission may use at most {self.box_memory_mb} MiB of memory")
        if any(o.get("ename") == "CellTimeoutError" for o in cell.get("outputs", [])):
            notes.append(f"each cell may run at most {self.timeout} s (Execute.timeout)")
        if notes and cell.get("cell_type") == "code":  # a markdown cell has no outputs
            cell.outputs.extend(_note(n) for n in notes)

    # ------------------------------------------------------------ sandbox
    def _handed_in(self) -> set[str]:
        """The names of the answers handed in so far (the hand-in folder holds nothing else of value)."""
        return {os.path.basename(c["payload"]) for _, calls in self._pending for c in calls}

    def _tidy_hand_in(self) -> None:
        """Remove from the hand-in folder whatever the kernel put there that is no answer.

        The folder is the box's to write and bounded (a tmpfs of the box's own,
        as root): a cell that filled it would otherwise leave no room for the
        answers of the cells after it, or for the ranks that grade them.
        """
        if self._box is None:  # unboxed: the hand-in folder is the work folder itself
            return
        folder, keep = str(self._box.handin), self._handed_in()
        for entry in os.scandir(folder):
            if entry.name in keep:
                continue
            with contextlib.suppress(Exception):  # OSError, or RecursionError on a folder nested deep enough
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)

    def _hand_in(self, calls: list[dict], index: int) -> str | None:
        """Pickle each call's answer from the kernel as it is now; a message if one could not be."""
        self._tidy_hand_in()
        for k, call in enumerate(calls):
            call["payload"] = os.path.join(os.environ[AUTOGRADE_ENV], f"cell{index}-{k}.pkl")
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                os.unlink(call["payload"])  # what the kernel put there beforehand (a FIFO, a link) is not an answer
            problem = self._dump(call["answer"], call["payload"], index)
            if problem:
                return problem
        return None

    def _grade_pending(self, nb) -> None:
        """Grade every handed-in test cell in one sandbox and put its verdict in the cell."""
        if not self._pending:
            return
        if self._box is not None:
            self._box.end_processes()  # the kernel's box is gone; so is anything it left
            self._box.bounds_hit()     # what the kernel's cells reached is noted already
        self._tidy_hand_in()  # room for the ranks' launch folders beside the answers
        results, crash = self._sandbox(self._pending)
        for index, calls in self._pending:
            got = results.get(index)
            if got is None:
                nb.cells[index].outputs = [_error("AssertionError", crash)]
                continue
            verdicts, printed = got["verdicts"], got["printed"]
            outputs = [_stdout(printed)] if printed else []
            failed = [v for v in verdicts if not v["passed"]]
            if failed or len(verdicts) < len(calls):
                message = failed[0]["message"] if failed else "the grader stopped before every check ran."
                outputs.append(_error("AssertionError", message))
            nb.cells[index].outputs = outputs

    def _dump(self, answer: str, path: str, index: int) -> str | None:
        """Have the kernel pickle ``answer`` by value into ``path``; a message if it could not."""
        code = ("import cloudpickle as __parlab_cp\n"  # pickled first: a failure writes no file
                f"__parlab_data = __parlab_cp.dumps({answer})\n"
                f"with open({path!r}, 'wb') as __parlab_f:\n"
                "    __parlab_f.write(__parlab_data)\n"
                "del __parlab_data\n")
        probe = NotebookNode(cell_type="code", source=code, metadata={}, outputs=[],
                             execution_count=None, id=f"parlab-dump-{index}")
        try:
            self._execute_aside(probe, index)
        except DeadKernelError:
            self._restart_and_replay(index)
            return f"the kernel died while handing in {answer} for grading."
        try:
            os.close(open_plain(path))  # a file the kernel wrote; not a link, a FIFO or a folder put in its place
            return None
        except NotPlainFile as exc:
            why = f" (the hand-in file is {exc.strerror})"
        except OSError:
            why = ""
        errors = [o for o in probe.outputs if o.get("output_type") == "error"]
        why = f" ({errors[0]['ename']}: {errors[0]['evalue']})" if errors else why
        return (f"{answer} could not be handed in for grading{why}. Did the cell that defines it "
                "run without an error?")

    def _sandbox(self, cells: list[tuple[int, list[dict]]]) -> tuple[dict, str]:
        """One sandbox process over every cell's calls: ({cell index: result}, why any is missing)."""
        request = os.path.join(self._workdir, "request.json")
        verdict_path = request + ".verdict"
        limit = self.timeout * len(cells) if self.timeout else None
        with open(request, "w") as f:
            json.dump({"cells": [{"key": index,
                                  "calls": [{"lab": c["lab"], "check": c["check"], "hidden": c["hidden"],
                                             "name": c["answer"], "payload": c["payload"]} for c in calls]}
                                 for index, calls in cells],
                       "verdict": verdict_path, "seconds": limit}, f)
        env = {k: v for k, v in os.environ.items() if k != AUTOGRADE_ENV}
        if self._box is not None:
            env[WRAPPER_ENV] = self._box.agent_wrapper()  # the ranks start in the box; this process does not
            env["TMPDIR"] = str(self._box.launches)  # launch folders of this sandbox only, in the box's bounded folder
        proc = subprocess.Popen([sys.executable, "-m", "parlab.grading.autograde.sandbox", request],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=env, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=limit)
            crash = f"the grader could not finish (exit code {proc.returncode}):\n{out[-3000:]}"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the sandbox's own session: it and its ranks
            proc.communicate()
            crash = f"grading took longer than {self.timeout} s per test cell and was stopped."
        if self._box is not None:
            self._box.end_processes()  # whatever the ranks left, before reading what they decided
            hit = self._box.bounds_hit()
            if hit:
                crash += f" (the grading ranks reached the submission's bound on {', '.join(hit)})"
        try:
            with open(verdict_path) as f:  # written after each cell: what finished is kept
                return {r["key"]: r for r in json.load(f)}, crash
        except (OSError, ValueError):
            return {}, crash

    def _execute_aside(self, cell, index: int) -> None:
        """Run ``cell`` in the kernel without it taking the place of notebook cell ``index``.

        (nbclient stores the cell it executed at its index in the notebook.)
        """
        original = self.nb.cells[index]
        try:
            self.execute_cell(cell, index, store_history=False)
        finally:
            self.nb.cells[index] = original

    # ------------------------------------------------------------ kernel death
    def _restart_kernel(self) -> None:
        run_sync(self.km.restart_kernel)(now=True)
        if self.kc is not None:
            self.kc.stop_channels()
        run_sync(self.async_start_new_kernel_client)()

    def _restart_and_replay(self, index: int) -> None:
        """A fresh kernel holding what the cells before ``index`` defined (killers skipped)."""
        self._restart_kernel()
        for earlier in range(index):
            cell = self.nb.cells[earlier]
            if cell.cell_type != "code" or earlier in self._killers or _is_test_cell(cell):
                continue
            try:
                self._execute_aside(copy.deepcopy(cell), earlier)
            except DeadKernelError:
                self._killers.add(earlier)
                self._restart_kernel()
                return self._restart_and_replay(index)
