"""The committed labs/ is exactly what nbgrader generates from solutions/, and leaks nothing.

Fast checks, no kernels.  Lab folders are discovered under solutions/, so a
new lab is covered as soon as it lands.  Each rule is a function returning a
list of problems; the last tests feed each rule a broken notebook to show it
catches it.

Drift: generation is deterministic (two runs give byte-identical files), so
the regenerated notebooks are compared as parsed JSON: everything counts
(cell types, ids, sources, nbgrader metadata including checksums, outputs)
and only the JSON layout is ignored.  nbgrader itself varies nothing between
runs; a different nbgrader version may compute other checksums, and that
difference is real (autograde compares them), so it fails here too.
"""
import copy
import json
import re
import shutil
from pathlib import Path

import nbformat
import pytest

from nbgrader_harness import REPO, lab_names, release_script, source_notebook

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(120)]

LABS = lab_names()
IGNORED_NAMES = (".ipynb_checkpoints", "__pycache__")  # local Jupyter/Python litter, git-ignored
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
FIX = "run `python scripts/release.py` (make release) and commit labs/"


# ------------------------------------------------------------------ the rules


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_answer(cell) -> bool:
    m = nbgrader_meta(cell)
    return cell.cell_type == "code" and m.get("solution", False) and not m.get("grade", False)


def is_test(cell) -> bool:
    m = nbgrader_meta(cell)
    return cell.cell_type == "code" and m.get("grade", False) and not m.get("solution", False)


def files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and not any(part in IGNORED_NAMES for part in p.parts)}


def drift(committed: Path, generated: Path) -> list[str]:
    """Differences between two release folders (labs/ and a fresh generation)."""
    ours, fresh = files(committed), files(generated)
    problems = [f"missing {p}" for p in sorted(fresh - ours)] + [f"unexpected {p}" for p in sorted(ours - fresh)]
    for rel in sorted(ours & fresh):
        a, b = committed / rel, generated / rel
        if not rel.endswith(".ipynb"):
            problems += [f"{rel} differs"] if a.read_bytes() != b.read_bytes() else []
            continue
        got, want = json.loads(a.read_text()), json.loads(b.read_text())
        if len(got["cells"]) != len(want["cells"]):
            problems.append(f"{rel}: {len(got['cells'])} cells, generation gives {len(want['cells'])}")
            continue
        for i, (g, w) in enumerate(zip(got["cells"], want["cells"])):
            problems += [f"{rel} cell {i} ({w.get('id')}): '{k}' differs"
                         for k in sorted(set(g) | set(w)) if g.get(k) != w.get(k)]
        problems += [f"{rel}: notebook '{k}' differs"
                     for k in sorted((set(got) | set(want)) - {"cells"}) if got.get(k) != want.get(k)]
    return problems


def regions(source: str, begin: str, end: str) -> list[str]:
    """The text strictly between each ``### BEGIN x`` / ``### END x`` pair."""
    return re.findall(rf"###\s*{begin}[^\n]*\n(.*?)\n[ \t]*###\s*{end}", source, flags=re.S)


def code_lines(text: str) -> set[str]:
    """Lines without indentation and trailing comments (a rough cut, good enough here)."""
    return {re.sub(r"\s+#.*$", "", ln).strip() for ln in text.splitlines()}


def telltale_lines(source_nb, begin: str, end: str) -> set[str]:
    """Lines inside the regions that appear nowhere else in the source notebook."""
    inside, outside = set(), set()
    for cell in source_nb.cells:
        body = regions(cell.source, begin, end)
        inside |= {ln for r in body for ln in code_lines(r)}
        rest = cell.source
        for r in body:
            rest = rest.replace(r, "")
        outside |= code_lines(rest)
    return {ln for ln in inside - outside if len(ln) >= 10 and not ln.startswith("#")}


def leaks(source_nb, released_nb) -> list[str]:
    """Solution code, hidden tests, outputs or missing stubs in a student notebook."""
    problems = [f"'{m}' is in the student notebook" for m in MARKERS if m in nbformat.writes(released_nb)]
    lines = {ln for cell in released_nb.cells for ln in code_lines(cell.source)}
    for begin, end, what in (("BEGIN SOLUTION", "END SOLUTION", "solution code"),
                             ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "hidden tests")):
        leaked = telltale_lines(source_nb, begin, end) & lines
        problems += [f"{what} leaked: {sorted(leaked)}"] if leaked else []
    for cell in released_nb.cells:
        if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None):
            problems.append(f"cell {cell.get('id')} has outputs")
        if is_answer(cell) and "raise NotImplementedError" not in cell.source:
            problems.append(f"answer cell {cell.get('id')} has no NotImplementedError stub")
    return problems


def dirty_cells(nb) -> list[str]:
    """Code cells that carry outputs or an execution count."""
    return [cell.get("id", str(i)) for i, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]


def _ungraded_on_purpose(cell) -> bool:
    """An answer cell the lab fills with the student's own code from an earlier lab (graded
    there): its metadata says why, as ``{"parlab": {"ungraded": "<reason>"}}``."""
    return bool(str(cell.get("metadata", {}).get("parlab", {}).get("ungraded", "")).strip())


def structure_problems(nb) -> list[str]:
    """Each answer cell defines a function, has a solution region, and is followed (before
    the next answer) by a locked test cell with points that names it and has a visible
    test; the notebook has at least one hidden test block."""
    cells, problems = nb.cells, []
    answers = [i for i, c in enumerate(cells) if is_answer(c)]
    if not answers:
        problems.append("no autograded answer cell")
    for n, i in enumerate(answers):
        cid = cells[i].get("id")
        names = re.findall(r"^(?:def|class)\s+(\w+)", cells[i].source, flags=re.M)
        if not names:
            problems.append(f"answer cell {cid} defines no function")
        if "### BEGIN SOLUTION" not in cells[i].source:
            problems.append(f"answer cell {cid} has no ### BEGIN SOLUTION region")
        stop = answers[n + 1] if n + 1 < len(answers) else len(cells)
        tests = [c for c in cells[i + 1:stop]
                 if is_test(c) and any(re.search(rf"\b{name}\b", c.source) for name in names)]
        if names and not tests and not _ungraded_on_purpose(cells[i]):
            problems.append(f"no graded test cell checks {names} (answer cell {cid})")
        for t in tests:
            meta = nbgrader_meta(t)
            if not meta.get("points", 0) > 0:
                problems.append(f"test cell {t.get('id')} has no points")
            if not meta.get("locked"):
                problems.append(f"test cell {t.get('id')} is not locked")
            visible = re.sub(r"###\s*BEGIN HIDDEN TESTS.*?###\s*END HIDDEN TESTS", "", t.source, flags=re.S)
            if not [ln for ln in visible.splitlines()
                    if ln.strip() and not ln.lstrip().startswith(("#", "import ", "from "))]:
                problems.append(f"test cell {t.get('id')} has no visible test for students to run")
    if not any(regions(c.source, "BEGIN HIDDEN TESTS", "END HIDDEN TESTS") for c in cells if is_test(c)):
        problems.append("no hidden test block")
    return problems


# ------------------------------------------------------------------ the course


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory) -> Path:
    """labs/ as scripts/release.py generates it from the current solutions/, in a temp course."""
    root = tmp_path_factory.mktemp("release")
    shutil.copy(REPO / "nbgrader_config.py", root)
    shutil.copytree(REPO / "solutions", root / "solutions", ignore=shutil.ignore_patterns(*IGNORED_NAMES))
    release_script.release(root)
    return root / "labs"


def test_labs_discovered():
    assert "00-setup" in LABS


def test_labs_match_generation(regenerated):
    problems = drift(REPO / "labs", regenerated)
    assert not problems, f"labs/ has drifted from solutions/ ({FIX}):\n" + "\n".join(problems)


@pytest.mark.parametrize("lab", LABS)
def test_release_leaks_nothing(lab):
    released = REPO / "labs" / lab / source_notebook(lab).name
    assert released.exists(), f"labs/{lab} is missing; {FIX}"
    problems = leaks(nbformat.read(source_notebook(lab), as_version=4), nbformat.read(released, as_version=4))
    assert not problems, f"labs/{lab}: " + "; ".join(problems)


@pytest.mark.parametrize("lab", LABS)
def test_source_committed_without_outputs(lab):
    dirty = dirty_cells(nbformat.read(source_notebook(lab), as_version=4))
    assert not dirty, (f"solutions/{lab}: cells {dirty} have outputs or execution counts; clear them "
                       "(Jupyter: Edit > Clear Outputs of All Cells) before committing")


@pytest.mark.parametrize("lab", LABS)
def test_every_answer_has_a_graded_test_with_hidden_cases(lab):
    problems = structure_problems(nbformat.read(source_notebook(lab), as_version=4))
    assert not problems, f"solutions/{lab}: " + "; ".join(problems)


# ------------------------------------------------------------------ the rules catch breakage

LAB00 = "00-setup"


def lab00_pair():
    src = nbformat.read(source_notebook(LAB00), as_version=4)
    rel = nbformat.read(REPO / "labs" / LAB00 / source_notebook(LAB00).name, as_version=4)
    return src, rel


def cell(nb, cid):
    return next(c for c in nb.cells if c.get("id") == cid)


def test_drift_is_caught(regenerated, tmp_path):
    shutil.copytree(regenerated, tmp_path / "labs")
    nb_path = tmp_path / "labs" / LAB00 / f"{LAB00}.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    cell(nb, "weights-md").source += "\nEdited by hand."
    nbformat.write(nb, nb_path)
    (tmp_path / "labs" / LAB00 / "stray.txt").write_text("x")
    problems = drift(tmp_path / "labs", regenerated)
    assert any("'source' differs" in p for p in problems) and any("unexpected" in p for p in problems), problems


def test_leaked_solution_hidden_test_and_outputs_are_caught():
    src, rel = lab00_pair()
    assert not leaks(src, rel)
    bad = copy.deepcopy(rel)
    cell(bad, "weight_bytes").source = cell(src, "weight_bytes").source  # the whole solution cell
    assert any("BEGIN SOLUTION" in p for p in leaks(src, bad))
    bad = copy.deepcopy(rel)  # solution code pasted without its markers
    cell(bad, "days_to_train").source = cell(src, "days_to_train").source.replace("### BEGIN SOLUTION", "") \
        .replace("### END SOLUTION", "")
    assert any("solution code leaked" in p for p in leaks(src, bad))
    bad = copy.deepcopy(rel)
    cell(bad, "hello-test").source += "\nlab00.check_hello(hello, hidden=True)"
    assert any("hidden tests leaked" in p for p in leaks(src, bad))
    bad = copy.deepcopy(rel)
    cell(bad, "doctor").outputs = [nbformat.v4.new_output("stream", text="ok\n")]
    assert any("has outputs" in p for p in leaks(src, bad))


def test_source_with_outputs_is_caught():
    src, _ = lab00_pair()
    assert not dirty_cells(src)
    cell(src, "hello-run").execution_count = 3
    assert dirty_cells(src) == ["hello-run"]


def test_structure_problems_are_caught():
    src, _ = lab00_pair()
    assert not structure_problems(src)
    no_points = copy.deepcopy(src)
    cell(no_points, "days_to_train-test").metadata.nbgrader.points = 0
    assert "test cell days_to_train-test has no points" in structure_problems(no_points)
    no_test = copy.deepcopy(src)
    no_test.cells.remove(cell(no_test, "weight_bytes-test"))
    assert any("no graded test cell checks ['weight_bytes']" in p for p in structure_problems(no_test))
    no_hidden = copy.deepcopy(src)
    for c in no_hidden.cells:
        c.source = re.sub(r"### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS", "", c.source, flags=re.S)
    assert "no hidden test block" in structure_problems(no_hidden)
    hidden_only = copy.deepcopy(src)
    cell(hidden_only, "hello-test").source = ("from parlab.grading import lab00\n### BEGIN HIDDEN TESTS\n"
                                              "lab00.check_hello(hello, hidden=True)\n### END HIDDEN TESTS")
    assert "test cell hello-test has no visible test for students to run" in structure_problems(hidden_only)
