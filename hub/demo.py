"""``make hub`` / ``make hub-stop``: a demo of the course hub on 127.0.0.1, to try the kit.

    python hub/demo.py start     # an instructor and two students, real Unix users (root only)
    python hub/demo.py preflight # parlab preflight against it, as an admin runs it on a host
    python hub/demo.py stop      # servers, hub, proxy, the users' processes and the users: gone

State (the hub's database, logs, the exchange, the admin token, which users
were made, and the deployment: the student edition, the servers' environment
built from it and the hub's config folder) lives in PARLAB_HUB_DEMO_STATE, by
default /srv/parlab-hub-demo; ``stop`` removes it.  The instructor's course is at ~parlab-teacher/parlab.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from course_hub import CourseHub, HubError  # noqa: E402

STATE = Path(os.environ.get("PARLAB_HUB_DEMO_STATE", "/srv/parlab-hub-demo"))
INSTRUCTORS = ["parlab-teacher"]
STUDENTS = ["parlab-ada", "parlab-bo"]


def _hub(port: int | None = None) -> CourseHub:
    return CourseHub(STATE, INSTRUCTORS, STUDENTS, port=port)


def start(port: int | None) -> int:
    if (STATE / "hub.pid").exists():
        print(f"a demo hub already runs (state in {STATE}); stop it first: make hub-stop")
        return 1
    hub = _hub(port)
    try:
        hub.deploy()  # the student edition and the servers' environment built from it, in the state folder
        passwords = hub.create_users()
        hub.prepare_course()
        hub.start()
    except HubError as e:
        print(f"make hub: {e}", file=sys.stderr)
        hub.stop()
        hub.remove_users()
        return 1
    (STATE / "demo.json").write_text(json.dumps({"port": hub.port}))
    print(f"parlab demo hub: {hub.url}/hub/login")
    print("logins (user / password):")
    for user in hub.users:
        role = "instructor" if user in INSTRUCTORS else "student"
        print(f"  {user:<16} {passwords[user]:<14} {role}")
    print(f"the instructor's course: ~{INSTRUCTORS[0]}/parlab (nbgrader generate_assignment 00-setup, "
          "then nbgrader release_assignment 00-setup, in a terminal of that server)")
    print(f"log: {STATE / 'jupyterhub.log'}; stop everything with: make hub-stop")
    return 0


def stop() -> int:
    if not STATE.exists():
        print("no demo hub (nothing to stop)")
        return 0
    try:
        port = json.loads((STATE / "demo.json").read_text())["port"]
    except (OSError, ValueError, KeyError):
        port = None
    hub = _hub(port)
    hub.stop()
    hub.remove_users()
    shutil.rmtree(STATE, ignore_errors=True)
    print("demo hub stopped; its servers, processes, users and state are gone")
    return 0


def preflight() -> int:
    """``parlab preflight`` against the running demo hub, as an admin runs it on a host (root)."""
    if not (STATE / "demo.json").exists():
        print("no demo hub runs: make hub first")
        return 1
    hub = _hub(json.loads((STATE / "demo.json").read_text())["port"])
    argv = [str(hub.python.parent / "parlab"), "preflight", "--url", hub.url, "--token-file", str(hub.token_file),
            "--hub-dir", str(hub.hub_dir), "--instructor", INSTRUCTORS[0], "--exchange", str(hub.exchange),
            "--report", str(STATE / "preflight-report.txt")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "JUPYTER", "PYTHON"))}
    env["PATH"] = f"{hub.python.parent}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(argv, env=env, cwd="/").returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["start", "stop", "preflight"])
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    args = parser.parse_args(argv)
    return {"start": lambda: start(args.port), "stop": stop, "preflight": preflight}[args.action]()


if __name__ == "__main__":
    sys.exit(main())
