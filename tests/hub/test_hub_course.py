"""The course on a real JupyterHub, as a class lives it: one story, in order, on one hub.

The hub is the kit deployed as docs/jupyterhub.md says (``CourseHub.deploy``:
the student edition, the servers' environment built from it, the hub's config
folder) with real Unix users (PAM logins, CourseSpawner servers in their
cgroups); Chromium does what students do in the page.  Steps that a person
would type in a terminal of their own server (the instructor's nbgrader
commands, a student trying to read someone else's files) run as that Unix
user (``CourseHub.run_as``: their uid, groups and their server's
environment); the grading runs as root outside any server, as the docs say.  The answers are put into a student's fetched
notebook through their server's contents API (what saving from an editor
does), not typed: the page then opens, runs and validates that notebook.

Scores: the right answers score 7 of 7; the wrong one (``weight_bits`` for
Exercise 2, from tests/wrong_answers/lab00.py) loses that exercise's 1 point.
The instructor sets the due date after plh-ada's last submission and before
plh-bo's: his is late, and the course's late policy (a tenth of the score
per started day) leaves him 5.4 of 7, which his feedback shows with the
penalty.  That parlab grade applies the policy exactly as serial nbgrader
does is tests/nbgrader/test_grade_late_penalty.py.
That ``parlab grade`` gives what serial ``nbgrader autograde`` gives for the
same submissions is shown by tests/nbgrader/test_grade_class.py; here the expected
scores are the per-exercise points of the notebook.
"""
from __future__ import annotations

import json
import os
import pwd
import re
import subprocess
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nbformat
import pytest

from hub_tier import INSTRUCTOR, REPO, STUDENTS

pytestmark = [pytest.mark.hub, pytest.mark.timeout(600)]
expect = pytest.importorskip("playwright.sync_api", reason="hub tier: playwright is not installed "
                             "(pip install -e '.[browser]')").expect

LAB = "00-setup"
NOTEBOOK = f"{LAB}/{LAB}.ipynb"
RIGHT, WRONG = STUDENTS  # plh-ada answers right (on her second submission), plh-bo wrong
STATE: dict = {}  # what one step leaves for the next (tokens, pages, times)


# ------------------------------------------------------------------ helpers


def answered_notebook(wrong: bool) -> nbformat.NotebookNode:
    """Lab 00 as released, graded cells and the doctor cell, answered (tests/class_course.py)."""
    from class_course import notebook
    from wrong_answers import lab00

    return notebook(LAB, REPO, wrong=("weight_bytes", lab00.weight_bits) if wrong else None)


def user_token(hub, user: str) -> str:
    if user not in STATE.setdefault("tokens", {}):
        STATE["tokens"][user] = hub.api("POST", f"/users/{user}/tokens", {"note": "hub tier"})["token"]
    return STATE["tokens"][user]


def save_notebook(hub, user: str, nb) -> None:
    """PUT the notebook into the user's ~/00-setup through their server's contents API."""
    body = json.dumps({"type": "notebook", "format": "json", "content": json.loads(nbformat.writes(nb))})
    req = urllib.request.Request(f"{hub.url}/user/{user}/api/contents/{NOTEBOOK}", data=body.encode(),
                                 method="PUT", headers={"Authorization": f"token {user_token(hub, user)}",
                                                        "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60):
        pass


def log_in(chromium, hub, user: str, password: str):
    context = chromium.new_context(viewport=_viewport())
    page = context.new_page()
    page.set_default_timeout(180_000)
    page.goto(f"{hub.url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", password)
    page.click("#login_submit")
    return page


def _viewport():
    from browser_tier_conftest import VIEWPORT  # put there by tests/hub/conftest.py
    return VIEWPORT


def nbgrader_menu(page) -> set[str]:
    """The items of JupyterLab's Nbgrader menu on this page (the menu is closed again)."""
    page.locator(".jp-LabShell").wait_for()
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    items = page.locator(".lm-Menu-content .lm-Menu-itemLabel")
    items.first.wait_for()
    labels = {label.strip() for label in items.all_inner_texts()}
    page.keyboard.press("Escape")
    return labels


def open_assignments(page):
    page.locator(".jp-LabShell").wait_for()
    page.locator(".lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    page.locator(".lm-Menu-itemLabel", has_text="Assignment List").click()
    expect(page.locator("#released_assignments_list")).to_be_visible()


def assignment_button(page, section: str, label: str):
    return page.locator(f"#{section}_assignments_list .list_item", has_text=LAB).get_by_role(
        "button", name=label).first


SUBMITTED_AT = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def submissions_listed(page) -> int:
    """How many submission times the Assignments tab lists under Submitted assignments."""
    return len(SUBMITTED_AT.findall(page.locator("#submitted_assignments_list").inner_text()))


def submit(page) -> None:
    before = submissions_listed(page)
    assignment_button(page, "fetched", "Submit").click()
    deadline = time.monotonic() + 120
    while submissions_listed(page) != before + 1:
        assert time.monotonic() < deadline, page.locator("#submitted_assignments_list").inner_text()
        time.sleep(0.3)


def set_due_date_to_now(hub) -> str:
    """The instructor sets lab 00's due date in the gradebook (as the formgrader does): now, in UTC.

    (The next whole second: every submission made before this call is earlier.)
    """
    due = (datetime.now(timezone.utc) + timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S UTC")
    hub.run_as(INSTRUCTOR, ["nbgrader", "db", "assignment", "add", LAB, f"--duedate={due}"],
               cwd=str(hub.course_dir()))
    return due


def lateness(course: Path) -> dict[str, tuple[float, float]]:
    """{student: (seconds late, late penalty)} of lab 00 in the course's gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}", "parlab") as gb:
        return {s.student.id: (s.total_seconds_late, s.late_submission_penalty)
                for s in gb.find_assignment(LAB).submissions}


def processes_of(user: str) -> list[int]:
    from course_hub import pids_of_uid
    return pids_of_uid(pwd.getpwnam(user).pw_uid)


def assert_none_left(user: str, within: float = 15) -> None:
    """No live process of ``user`` (SIGKILLed processes take a moment to go); else name them."""
    deadline = time.monotonic() + within
    while processes_of(user) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {}
    for pid in processes_of(user):
        try:
            left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            pass
    assert not left, f"processes of {user} left: {left}"


def server_pid(hub, user: str) -> int:
    from course_spawner import ServerCgroups
    return min(ServerCgroups(user).pids())


# ------------------------------------------------------------------ the story


def test_instructor_releases_lab00_and_servers_are_set_up_for_the_course(course_hub, chromium):
    hub = course_hub
    course = str(hub.course_dir())
    # The instructor logs in on the hub's login page; their server has the formgrader.
    page = log_in(chromium, hub, INSTRUCTOR, hub.passwords[INSTRUCTOR])
    page.wait_for_url(f"**/user/{INSTRUCTOR}/lab**")
    assert {"Formgrader", "Assignment List"} <= nbgrader_menu(page)
    page.context.close()
    # The release, as typed in a terminal of that server (as the instructor's Unix user).
    hub.run_as(INSTRUCTOR, ["nbgrader", "generate_assignment", LAB, "--force"], cwd=course)
    hub.run_as(INSTRUCTOR, ["nbgrader", "release_assignment", LAB], cwd=course)
    released = hub.exchange / "parlab" / "outbound" / LAB / f"{LAB}.ipynb"
    assert released.exists()
    # Not released: a clear message naming what is there.
    refused = hub.run_as(WRONG, ["nbgrader", "fetch_assignment", "01-collectives"], check=False)
    assert refused.returncode != 0
    assert "Assignment not found at" in refused.stdout and "Did you mean" in refused.stdout, refused.stdout

    # The kernel every lab names is the one the students' servers run (the parlab environment).
    kernel_names = {nbformat.read(p, as_version=4).metadata.kernelspec.name
                    for p in sorted((REPO / "labs").glob("*/*.ipynb"))}
    assert kernel_names == {"python3"}
    # Validate on a student's server uses the course's cell timeout, not nbgrader's 30 s.
    probe = ("from nbgrader.server_extensions.validate_assignment.handlers import ValidateAssignmentHandler as H;"
             "print(H.load_config(None).Execute.timeout)")
    course_timeout = re.search(r"c\.Execute\.timeout = (\d+)", (REPO / "nbgrader_config.py").read_text())
    assert hub.run_as(WRONG, ["python", "-c", probe]).stdout.split()[-1] == course_timeout.group(1)


def test_students_log_in_fetch_work_validate_and_submit(course_hub, chromium):
    from notebook_ui import Notebook

    hub = course_hub
    passwords = hub.passwords
    # A wrong password: the login page says so, and nothing starts.
    page = log_in(chromium, hub, RIGHT, passwords[RIGHT] + "x")
    expect(page.locator("body")).to_contain_text("Invalid username or password")
    assert hub.running_servers() == [INSTRUCTOR]  # the instructor's, from the first test; none for her
    page.context.close()
    pages = {}
    for user in STUDENTS:
        page = log_in(chromium, hub, user, passwords[user])
        page.wait_for_url(f"**/user/{user}/lab**")
        menu = nbgrader_menu(page)  # a student's: the Assignments tab, no formgrader
        assert "Assignment List" in menu and not menu & {"Formgrader", "Course List"}, menu
        open_assignments(page)
        assignment_button(page, "released", "Fetch").click()
        expect(assignment_button(page, "fetched", "Submit")).to_be_visible()
        pages[user] = page

    # The server: the servers' environment, no GPU, one core (the hub's default for a class of 3 on
    # 2 cores), its cgroups: CPU set, memory, pids and devices.
    for user in STUDENTS:
        pid = server_pid(hub, user)
        environ = dict(kv.split("=", 1) for kv in
                       Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in kv)
        assert environ["CUDA_VISIBLE_DEVICES"] == ""
        assert len(os.sched_getaffinity(pid)) == 1
        cgroups = Path(f"/proc/{pid}/cgroup").read_text()
        assert all(f"{c}:/parlab-hub/{user}" in cgroups for c in ("cpuset", "memory", "pids", "devices")), cgroups

    # plh-ada submits a wrong answer first, then the right one: the later one counts.
    save_notebook(hub, RIGHT, answered_notebook(wrong=True))
    submit(pages[RIGHT])
    save_notebook(hub, WRONG, answered_notebook(wrong=True))
    save_notebook(hub, RIGHT, answered_notebook(wrong=False))

    for user in STUDENTS:
        page = pages[user]
        page.goto(f"{hub.url}/user/{user}/lab/tree/{NOTEBOOK}")
        nb = Notebook(page).wait_ready(timeout=180)
        doctor = nb.code_cell("doctor.main()")
        nb.run_and_wait(doctor, timeout=240)
        report = nb.outputs(doctor).inner_text()
        lines = [line for line in report.splitlines() if line.strip()]
        assert "parlab doctor: all good" in report, report
        checks = [line for line in lines if line.startswith(("ok", "BAD"))]
        assert checks and all(line.startswith("ok") for line in checks), report
        STATE.setdefault("doctor", {})[user] = report

    # Validate (the notebook toolbar's button) passes for the right answers.
    page = pages[RIGHT]
    start = time.monotonic()
    page.locator(".jp-NotebookPanel-toolbar").get_by_role("button", name="Validate").click()
    dialog = page.locator(".jp-Dialog")
    expect(dialog).to_contain_text("Success! Your notebook passes all the tests.", timeout=300_000)
    STATE["validate_s"] = time.monotonic() - start
    dialog.get_by_role("button").last.click()

    for user in STUDENTS:
        open_assignments(pages[user])
        if user == WRONG:  # the due date passes after plh-ada's last submission, before plh-bo's
            STATE["due"] = set_due_date_to_now(hub)
        submit(pages[user])
    STATE["pages"] = pages
    inbound = hub.exchange / "parlab" / "inbound"
    assert len(os.listdir(inbound)) == 3  # two of plh-ada's, one of plh-bo's


def test_students_cannot_reach_what_is_not_theirs(course_hub):
    hub = course_hub
    exchange = hub.exchange / "parlab"
    theirs = next(p for p in os.listdir(exchange / "inbound") if p.startswith(RIGHT + "+"))
    course = hub.course_dir()
    probe = f"""
import os, sys
checks = {{
    "list the exchange's inbound": lambda: os.listdir({str(exchange / 'inbound')!r}),
    "read another student's submission without its random name": lambda: open(
        {str(exchange / 'inbound' / theirs.rsplit('+', 1)[0])!r} + "/{NOTEBOOK.split('/')[1]}").read(),
    "list another student's home": lambda: os.listdir({pwd.getpwnam(RIGHT).pw_dir!r}),
    "read another student's notebook": lambda: open({pwd.getpwnam(RIGHT).pw_dir + '/' + NOTEBOOK!r}).read(),
    "list the instructor's course": lambda: os.listdir({str(course)!r}),
    "read the gradebook": lambda: open({str(course / 'gradebook.db')!r}, 'rb').read(),
    "read solutions/": lambda: open({str(course / 'solutions' / LAB / (LAB + '.ipynb'))!r}).read(),
    "change the released lab": lambda: open({str(exchange / 'outbound' / LAB / (LAB + '.ipynb'))!r}, "a"),
    "add a file to the released lab": lambda: open({str(exchange / 'outbound' / LAB / 'extra.py')!r}, "w"),
    "release a lab": lambda: os.mkdir({str(exchange / 'outbound' / 'fake-lab')!r}),
}}
for what, attempt in checks.items():
    try:
        attempt()
        print("ALLOWED", what)
    except (PermissionError, FileNotFoundError) as e:
        print("refused", what, type(e).__name__)
"""
    out = hub.run_as(WRONG, ["python", "-c", probe]).stdout
    assert "ALLOWED" not in out and out.count("refused") == 10, out
    # nbgrader names each submission <student>+<lab>+<time>+<12 random characters>.
    assert re.fullmatch(rf"{RIGHT}\+{LAB}\+[^+]+\+[A-Za-z0-9_-]{{12}}", theirs), theirs

    # That no file a student can read holds solution text (the servers run the student edition, installed)
    # is preflight's search, from a student's own server after the whole course: test_hub_preflight.py.


def test_hub_restart_mid_course_loses_no_submission(course_hub):
    hub = course_hub
    inbound = hub.exchange / "parlab" / "inbound"
    before = sorted(os.listdir(inbound))
    servers = hub.running_servers()
    hub.stop_hub()
    hub.start()
    assert sorted(os.listdir(inbound)) == before
    assert hub.running_servers() == servers  # the students' servers kept running (cleanup_servers off)
    # While the hub was down JupyterLab said the server was unreachable: reload, as a student would.
    for user, page in STATE["pages"].items():
        page.reload()
        page.wait_for_url(f"**/user/{user}/lab**")
        page.locator(".jp-LabShell").wait_for()


def test_instructor_collects_grades_and_returns_feedback(course_hub):
    hub = course_hub
    course = str(hub.course_dir())
    hub.run_as(INSTRUCTOR, ["nbgrader", "collect", LAB], cwd=course)
    ada_first, ada_second = sorted(p for p in os.listdir(hub.exchange / "parlab" / "inbound")
                                   if p.startswith(RIGHT + "+"))
    collected = Path(course) / "submitted" / RIGHT / LAB / "timestamp.txt"
    # Her later submission, stamped with the server's time of it (hub/safe_collect.py: its files' ctime),
    # which follows the time its name says by the seconds Submit took; the first came minutes before.
    from nbgrader.utils import parse_utc
    stamped, named = parse_utc(collected.read_text()), parse_utc(ada_second.split("+")[2])
    assert timedelta(0) <= stamped - named < timedelta(seconds=60), (collected.read_text(), ada_second)
    start = time.monotonic()
    # Grading as docs/jupyterhub.md says: as root in the host's shell, outside any server, no GPU, with the
    # instructor's hub config (the late policy); then the course's files are given back to the instructor.
    env = {**hub.server_env(INSTRUCTOR), "HOME": "/root", "USER": "root", "LOGNAME": "root",
           "JUPYTER_CONFIG_PATH": str(hub.hub_dir / "instructor"), "CUDA_VISIBLE_DEVICES": ""}
    graded = subprocess.run([str(hub.python.parent / "parlab"), "grade", LAB], cwd=course, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert graded.returncode == 0, graded.stdout[-3000:]
    subprocess.run(["chown", "-R", f"{INSTRUCTOR}:", course], check=True)
    STATE["grade_s"] = time.monotonic() - start
    from class_course import gradebook_scores

    scores = gradebook_scores(Path(course), LAB)
    full = {cell: (top, top) for cell, (_, top) in scores[RIGHT].items()}
    assert sum(top for top, _ in full.values()) == 7, scores  # lab 00's 5 exercises, 7 points
    assert scores[RIGHT] == full, graded.stdout
    assert scores[WRONG] == dict(full, **{"weight_bytes-test": (0.0, 1.0)}), graded.stdout
    # plh-bo submitted after the due date: the course's late policy (hub/late_penalty.py, named in
    # hub/instructor/nbgrader_config.py) takes a tenth of his 6 points for the one started day.
    late = lateness(Path(course))
    assert late[RIGHT] == (0, 0.0), (STATE["due"], late)
    assert 0 < late[WRONG][0] < 3600 and late[WRONG][1] == pytest.approx(0.6), (STATE["due"], late)

    hub.run_as(INSTRUCTOR, ["nbgrader", "release_feedback", LAB], cwd=course)
    for user, score in ((RIGHT, "7.0 / 7.0"), (WRONG, "5.4 / 7.0")):
        page = STATE["pages"][user]
        open_assignments(page)
        page.locator("#submitted_assignments_list").get_by_role("button", name="Fetch Feedback").first.click()
        expect(page.locator("#submitted_assignments_list")).to_contain_text("view feedback", timeout=120_000)
        html = hub.run_as(user, ["sh", "-c", f"cat ~/{LAB}/feedback/*/{LAB}.html"]).stdout
        assert f"(Score: {score})" in html, html[:2000]  # the notebook's score, after the penalty
        said_late = "Late submission penalty (Score: -0.6)" in html
        assert said_late == (user == WRONG), html[:2000]


def test_a_server_stopped_in_the_middle_of_a_launch_leaves_no_process(course_hub):
    from concurrent.futures import ThreadPoolExecutor

    from course_spawner import ServerCgroups

    # In a thread of its own: the kernel client's event loop cannot run inside Playwright's.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(_stop_in_the_middle_of_a_launch, course_hub, WRONG).result()
    assert_none_left(WRONG)
    assert ServerCgroups(WRONG).pids() == []


def _stop_in_the_middle_of_a_launch(hub, user: str) -> None:
    from kernel_api import UserKernel

    with UserKernel(f"{hub.url}/user/{user}", user_token(hub, user)) as kernel:
        where = kernel.execute("import sys, parlab; print(sys.executable)")
        # the python3 kernel runs the servers' environment's Python (the student edition installed)
        assert Path(where.stdout.strip()).parent == hub.python.parent, where
        before = set(processes_of(user))
        kernel.send("import time\nparlab.launch(lambda: time.sleep(300), nproc=2)")  # not waited for
        deadline = time.monotonic() + 120
        while len(set(processes_of(user)) - before) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)  # torchrun and its 2 ranks
        assert len(set(processes_of(user)) - before) >= 3, "the launch did not start"
        hub.stop_server(user)


def test_nothing_is_left_after_the_tier(course_hub):
    hub = course_hub
    for user in hub.running_servers():
        hub.stop_server(user)
    assert hub.running_servers() == []
    for user in hub.users:
        assert_none_left(user)
    report = {"validate_s": round(STATE.get("validate_s", 0), 1), "grade_s": round(STATE.get("grade_s", 0), 1)}
    print("hub tier:", report)
