"""Students' launches on one shared host: private folders, a store that cannot be fed, a namespace.

Two throw-away Unix users (made with useradd, removed afterwards) act out
``shared_host_roles.py``: alice launches, bob pokes at her launch while it runs.
Without root (or useradd) those tests are skipped with the reason; the
store and folder checks that need no second user run in-process.  A launch
in a network namespace of its own (bubblewrap) shows the remedy for what
stays open (docs/launcher.md, "On a shared host").

The users run the suite's own interpreter.  Where it lies under a folder
other users may not enter (/root on the course machines), each of their
commands runs in a private mount namespace (bubblewrap, as root) whose copy
of that folder shows only the interpreter's tree, read-only; /tmp and
everything else are the host's.
"""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest
import torch.distributed as dist

import parlab
from parlab.launch import jobdir, procs
from parlab.launch.signed_store import SignedStore, StoreTampered

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(400)]

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/, where the support modules are
ROLES = os.path.join(HERE, "shared_host_roles.py")
from shared_host_roles import NEXT_GROUP_KEY, store_answers  # noqa: E402 - tests/ is on sys.path
from unix_users import as_user, users  # noqa: E402,F401 - users is the throw-away users' fixture


# ---------------------------------------------------------------- the store, signed (no processes)

def test_signed_values_round_trip_and_foreign_ones_are_refused():
    inner = dist.HashStore()
    store = SignedStore(inner, os.urandom(32), "here:1")
    store.set("a", b"\x00\x01 value")
    assert store.get("a") == b"\x00\x01 value"
    assert inner.get("a") != b"\x00\x01 value"  # what lies in the store carries the tag
    inner.set("b", b"written by someone else")
    with pytest.raises(StoreTampered, match=r"'b' in this launch's c10d store \(here:1\) was not written"):
        store.get("b")
    inner.set("c", inner.get("a"))  # a real value copied under another key
    with pytest.raises(StoreTampered):
        store.get("c")
    other = SignedStore(inner, os.urandom(32), "here:1")  # another launch's secret
    with pytest.raises(StoreTampered):
        other.get("a")


def test_signed_compare_set_keeps_the_stores_semantics():
    store = SignedStore(dist.HashStore(), os.urandom(32), "here:1")
    assert store.compare_set("k", b"", b"first") == b"first"      # missing key, empty expectation
    assert store.compare_set("k", b"wrong", b"second") == b"first"  # mismatch: the current value
    assert store.compare_set("k", b"first", b"second") == b"second"
    assert store.get("k") == b"second"
    assert store.compare_set("absent", b"x", b"y") == b"x" and not store.check(["absent"])
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5  # counters pass through, unsigned


# ---------------------------------------------------------------- the jobs folder (in-process)

@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """A TMPDIR of its own, so the real $TMPDIR/parlab-<uid> is never touched."""
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o1777)
    tmp.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tmp


def test_a_link_in_place_of_the_jobs_folder_is_refused(private_tmp, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (private_tmp / f"parlab-{os.getuid()}").symlink_to(target)
    with pytest.raises(parlab.LaunchError, match="not a folder owned by you .* but a link"):
        jobdir.private_jobs_root()
    assert list(target.iterdir()) == []


def test_a_temporary_folder_others_can_replace_things_in_is_refused(private_tmp):
    private_tmp.chmod(0o777)  # world-writable without the sticky bit
    with pytest.raises(parlab.LaunchError, match="no sticky bit.*Set TMPDIR"):
        jobdir.private_jobs_root()
    assert not (private_tmp / f"parlab-{os.getuid()}").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to plant a folder owned by someone else")
def test_a_jobs_folder_left_open_is_made_private_and_what_others_put_there_is_ignored(private_tmp, capfd):
    root = private_tmp / f"parlab-{os.getuid()}"
    root.mkdir()
    root.chmod(0o777)
    planted = root / "launch-1-t1-planted"  # owner pid 1 "gone" would get swept, and its pids killed
    planted.mkdir()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (planted / "pid.0").write_text(f"{bystander.pid} {procs.start_time(bystander.pid)}")
        os.chown(planted, 12345, 12345)
        os.chown(planted / "pid.0", 12345, 12345)
        assert jobdir.private_jobs_root() == str(root)
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert "was open to other users (mode 0777); it is private again" in capfd.readouterr().err
        jobdir.sweep_stale_jobs()
        assert planted.exists() and bystander.poll() is None  # neither swept nor its "pids" killed
    finally:
        bystander.kill()
        bystander.wait()


# ---------------------------------------------------------------- two real users

@pytest.fixture(scope="module")
def shared(users):
    """The scenario of ``shared_host_roles.py``, run once; its findings as dicts."""
    # in /tmp itself: TMPDIR may be a folder of root's that the two users cannot enter (pytest's own)
    base = tempfile.mkdtemp(prefix="parlab-shared-host-", dir="/tmp")
    tmp, squat = os.path.join(base, "tmp"), os.path.join(base, "squat")
    for folder in (base, tmp, squat):
        os.makedirs(folder, exist_ok=True)
        os.chmod(folder, 0o1777 if folder != base else 0o755)  # like /tmp
    alice, bob = users["alice"], users["bob"]
    # bob squats alice's jobs folder before she ever launches, open to everyone
    os.mkdir(os.path.join(squat, f"parlab-{alice.pw_uid}"))
    os.chown(os.path.join(squat, f"parlab-{alice.pw_uid}"), bob.pw_uid, bob.pw_gid)
    os.chmod(os.path.join(squat, f"parlab-{alice.pw_uid}"), 0o777)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": tmp, "HOME": tmp,
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    started = {
        "alice": subprocess.Popen(as_user(alice.pw_name, [sys.executable, ROLES, "alice", tmp, squat], env),
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
        "bob": subprocess.Popen(as_user(bob.pw_name, [sys.executable, ROLES, "bob", tmp], env),
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
    }
    try:
        outputs = {who: p.communicate(timeout=300)[0] for who, p in started.items()}
    finally:
        for p in started.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    found = {"uids": {"alice": alice.pw_uid, "bob": bob.pw_uid}, "output": outputs}
    for name in ("ready", "bob", "alice", "alice-squat", "phase1.0", "phase1.1"):
        try:
            with open(os.path.join(tmp, f"{name}.json")) as f:
                found[name] = json.load(f)
        except FileNotFoundError:
            found[name] = None
    found["left in tmp"] = sorted(os.listdir(tmp))
    hers = os.path.join(tmp, f"parlab-{alice.pw_uid}")
    found["left in alice's folder"] = sorted(os.listdir(hers)) if os.path.isdir(hers) else None
    shutil.rmtree(base)
    yield found


def _said(found):
    return "\n".join(f"--- {who}\n{text[-3000:]}" for who, text in found["output"].items())


def test_each_students_launch_folder_is_theirs_alone(shared):
    assert shared["ready"] and shared["bob"], _said(shared)
    for path, st in shared["ready"]["folders"].items():  # alice's launch folder and its parent
        assert (st["uid"], st["mode"]) == (shared["uids"]["alice"], 0o700), (path, st)
    assert set(shared["bob"]["folders"].values()) == {"PermissionError"}, shared["bob"]["folders"]
    own = shared["bob"]["own_launch"]
    assert own["ok"], own
    for path, st in own["value"][0].items():  # bob's launch, at the same time, in his own folder
        assert (st["uid"], st["mode"]) == (shared["uids"]["bob"], 0o700), (path, st)
    assert shared["left in alice's folder"] == []  # her launch folder went with her launch


def test_a_jobs_folder_squatted_by_another_student_is_refused(shared):
    squat = shared["alice-squat"]
    assert squat is not None and not squat["ok"], _said(shared)
    assert squat["type"] == "LaunchError"
    assert f"is not a folder owned by you (uid {shared['uids']['alice']}) but owned by uid " \
           f"{shared['uids']['bob']}" in squat["message"] and "set TMPDIR" in squat["message"]


def test_foreign_connections_to_the_store_and_gloo_leave_the_results_right(shared):
    bob = shared["bob"]
    assert bob is not None, _said(shared)
    # what stays open on a shared host: bob reaches her store and her ranks' sockets
    assert bob["store_raw"] == "connected" and bob["store_read"] > 0
    assert "0//cpu//0/0" in bob["store_keys"] and "0//cpu//0/1" in bob["store_keys"]
    assert bob["gloo"] and set(bob["gloo"]) == {"connected"} and set(bob["gloo_held"]) == {"connected"}
    for rank in (0, 1):
        got = shared[f"phase1.{rank}"]
        assert got is not None, _said(shared)
        assert got["sums"] == [[float(2 * (c + i) + 10) for c in range(4)] for i in range(5)]
        assert got["broadcast"] == 1.0


def test_a_forged_value_in_the_store_stops_the_launch_with_a_clear_message(shared):
    got = shared["alice"]
    assert got is not None and not got["ok"], _said(shared)
    assert got["type"] == "WorkerError" and got["message"].startswith("rank 0 failed: StoreTampered")
    assert f"the value of '{NEXT_GROUP_KEY}' in this launch's c10d store" in got["message"]
    assert "another process on this host connected to the store" in got["message"]
    assert got["seconds"] < 60, "the launch waited instead of stopping"


# ---------------------------------------------------------------- the remedy: a network namespace

def _reason_no_netns():
    if not shutil.which("bwrap"):
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(["bwrap", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev", "true"],
                           capture_output=True, text=True)
    return None if probe.returncode == 0 else f"this machine cannot make a network namespace: {probe.stderr}"


def _code_under_tmp() -> list[str]:
    """Bind back the interpreter's environment and this checkout where they live under /tmp (a clone there)."""
    out = []
    for path in sorted({os.path.realpath(sys.prefix), os.path.realpath(os.path.join(HERE, os.pardir))}):
        if path.startswith("/tmp/"):
            out += ["--ro-bind", path, path]
    return out


def test_a_network_namespace_per_student_keeps_others_off_the_store(tmp_path):
    reason = _reason_no_netns()
    if reason:
        pytest.skip(reason)
    inside = tmp_path / "inside"
    inside.mkdir()
    jail = subprocess.Popen(["bwrap", "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
                             "--tmpfs", "/tmp", *_code_under_tmp(), "--bind", str(tmp_path), str(tmp_path),
                             "--die-with-parent", "--",
                             sys.executable, ROLES, "namespaced", str(inside)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (inside / "inside.json").exists() and jail.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (inside / "inside.json").exists(), jail.communicate(timeout=30)[0][-3000:]
        from_outside = store_answers(int((inside / "port").read_text()))
        (inside / "go").touch()
        said = jail.communicate(timeout=120)[0]
    finally:
        if jail.poll() is None:
            jail.kill()
            jail.wait()
    assert jail.returncode == 0, said[-3000:]
    assert json.loads((inside / "got").read_text()) == [3.0, 3.0]  # the namespaced launch ran right
    # the same probe: a TCPStore answers inside the namespace, and nothing answers outside it
    assert json.loads((inside / "inside.json").read_text()) == "store"
    assert from_outside == "refused"
