"""The student distribution (``make student-dist``) holds no solution, and the self-study path works from it.

The repository is built once into a temporary folder.  Searched for:
nbgrader's solution and hidden-test markers; the ``solutions/`` and
``tests/`` folders (``tests/wrong_answers/`` holds answers); every line of
the solutions' ``BEGIN SOLUTION`` blocks and hidden-test blocks that no
released notebook shows (the solution code itself, not only
its markers).  Then a wheel is built from the distribution, installed into
a folder of its own, and ``parlab doctor`` runs from that install with a
2-rank launch and a warm group, as ``make lab``'s first cell does.

The package is shipped by design (students' visible checks run on their
machine), so a few solution lines also occur in it: those are listed in
``IN_PACKAGE`` with what they are, and any other one fails the test.
"""
import ast
import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.nbgrader, pytest.mark.timeout(240)]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
#: Solution lines that the package holds too, by lab.  Most are idioms any code writes; the
#: ones marked (reveals) are a reference implementation in the package equal to the answer.
IN_PACKAGE = {
    "00-setup": {"return n_params * bytes_per_param"},  # parlab.cost's formula (lab 00 checks against it)
    "02-data-parallel": {"for p in reversed([p for p in model.parameters() if p.requires_grad]):",
                         "size += p.numel() * p.element_size()", "lm_loss(model, x, y).backward()"},
    "03-tensor-parallel": {"return self.down(F.gelu(self.up(x)))"},  # parlab.models.moe's expert MLP
    "04-pipeline-parallel": {"return sum(shares) / len(shares)"},
    "06-3d-parallel": {  # parlab.planner: the lab's planner exercises rebuild parts of it (reveals)
        "layers = planner.stage_layers(plan, model)", "w, g, o = cost.PRECISIONS[plan.precision]",
        "return cost.activation_bytes_per_layer(model.seq / plan.cp, plan.micro_batch, model.hidden, model.heads,",
        "t=plan.tp, sp=plan.sp, recompute=mode, scores=model.scores,",
        "return [d for d in range(1, n + 1) if n % d == 0]",
        "vs = [1] + [v for v in (2, 4) if pp > 1 and m.layers % (pp * v) == 0 and accum % pp == 0]"},
    "07-context-expert": {
        # the zig-zag split, in the checks' reference (parlab.grading.lab07.ring) (reveals)
        "return torch.stack([torch.cat([chunks[r], chunks[2 * c - 1 - r]]) for r in range(c)])",
        "expert, weight, kept = route(self.router, x, self.top_k, self.capacity_factor)"},  # parlab.models.moe
}


def _student_dist():
    spec = importlib.util.spec_from_file_location("student_dist", os.path.join(ROOT, "scripts", "student_dist.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    return _student_dist().build(str(tmp_path_factory.mktemp("dist") / "student"))


def files(root):
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            path = os.path.join(folder, name)
            yield os.path.relpath(path, root), open(path, encoding="utf-8", errors="replace").read()


def cell_lines(text: str, path: str) -> set[str]:
    """Stripped lines of a file; of a notebook, of its cells' sources."""
    if path.endswith(".ipynb"):
        text = "\n".join("".join(c["source"]) for c in json.loads(text)["cells"])
    return {line.strip() for line in text.splitlines()}


def answer_lines(lab: str) -> set[str]:
    """Lines of the lab's solution and hidden-test blocks that no released notebook shows."""
    with open(os.path.join(ROOT, "solutions", lab, f"{lab}.ipynb")) as f:
        cells = json.load(f)["cells"]
    shown = set()
    for released in os.listdir(os.path.join(ROOT, "labs")):
        with open(os.path.join(ROOT, "labs", released, f"{released}.ipynb")) as f:
            shown |= cell_lines(f.read(), ".ipynb")
    found, inside = set(), False
    for cell in cells:
        for line in "".join(cell["source"]).splitlines():
            if "BEGIN SOLUTION" in line or "BEGIN HIDDEN TESTS" in line:
                inside = True
            elif "END SOLUTION" in line or "END HIDDEN TESTS" in line:
                inside = False
            elif inside and len(line.strip()) >= 30 and not line.strip().startswith("#"):
                found.add(line.strip())
    return found - shown


def test_it_is_a_clean_repository_with_the_labs_and_the_package_and_no_answers_folder(dist):
    paths = {p for p, _ in files(dist)}
    labs = sorted(os.listdir(os.path.join(ROOT, "labs")))
    assert {f"labs/{lab}/{lab}.ipynb" for lab in labs} <= paths
    assert {"Makefile", "pyproject.toml", "README.md", "src/parlab/__init__.py", "constraints/cpu.txt"} <= paths
    assert not [p for p in paths if {"solutions", "tests", "wrong_answers"} & set(p.split(os.sep))]
    status = subprocess.run(["git", "-C", dist, "status", "--porcelain"], capture_output=True, text=True)
    log = subprocess.run(["git", "-C", dist, "log", "--oneline"], capture_output=True, text=True)
    assert status.returncode == 0 and status.stdout == "" and len(log.stdout.splitlines()) == 1
    readme = open(os.path.join(dist, "README.md")).read()
    assert "make lab" in readme and "make test" not in readme and "wrong_answers" not in readme


def test_no_marker_and_no_solution_or_hidden_test_line_is_shipped(dist):
    shipped = dict(files(dist))
    with_markers = {p for p, text in shipped.items() if any(m in text for m in MARKERS)}
    # the one place: the grading package's docstring showing what a lab's test cell looks like
    assert with_markers == {"src/parlab/grading/__init__.py"}, with_markers
    doc = ast.get_docstring(ast.parse(shipped["src/parlab/grading/__init__.py"]))
    assert all(m in doc for m in ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS"))
    lines = {p: cell_lines(text, p) for p, text in shipped.items()}
    for lab in sorted(os.listdir(os.path.join(ROOT, "solutions"))):
        answers = answer_lines(lab)
        assert len(answers) >= 5, (lab, answers)  # the search has something to find
        outside = {(p, a) for p, ls in lines.items() if not p.startswith("src/") for a in answers & ls}
        assert not outside, outside
        in_package = {a for p, ls in lines.items() if p.startswith("src/") for a in answers & ls}
        assert in_package <= IN_PACKAGE.get(lab, set()), (lab, in_package - IN_PACKAGE.get(lab, set()))


def test_a_wheel_of_it_installs_and_parlab_doctor_runs_from_the_install(dist, tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), dist],
                   check=True, cwd=tmp_path)
    (wheel,) = os.listdir(tmp_path / "wheel")
    subprocess.run(pip + ["install", "--no-deps", "--target", str(tmp_path / "site"), str(tmp_path / "wheel" / wheel)],
                   check=True, cwd=tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    where = subprocess.run([sys.executable, "-c", "import parlab; print(parlab.__file__)"], env=env,
                           capture_output=True, text=True, cwd=dist)
    assert where.stdout.startswith(str(tmp_path / "site")), where
    doctor = subprocess.run([sys.executable, "-m", "parlab", "doctor"], env=env, capture_output=True, text=True,
                            cwd=dist, timeout=200)
    assert doctor.returncode == 0 and "2-rank all_reduce" in doctor.stdout, doctor.stdout + doctor.stderr
