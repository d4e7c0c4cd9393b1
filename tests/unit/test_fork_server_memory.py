"""The fork server's memory rule: it starts only where the kernel's memory cgroup (v2 or v1) leaves room."""
import pytest

from parlab.launch import fork_server

pytestmark = pytest.mark.unit

GiB = 2 ** 30


def fake(tmp_path, cgroup: str, files: dict) -> tuple[str, str]:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    for path, text in files.items():
        target = tmp_path / "root" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(proc), str(tmp_path / "root")


@pytest.mark.parametrize("cgroup, files, left", [
    ("0::/user/alice\n", {"/sys/fs/cgroup/user/alice/memory.max": f"{4 * GiB}\n",
                          "/sys/fs/cgroup/user/alice/memory.current": f"{3 * GiB}\n"}, 1 * GiB),
    ("4:memory:/hub/bob\n0::/\n", {"/sys/fs/cgroup/memory/hub/bob/memory.limit_in_bytes": f"{2 * GiB}\n",
                                   "/sys/fs/cgroup/memory/hub/bob/memory.usage_in_bytes": f"{int(1.5 * GiB)}\n"},
     GiB // 2),
])
def test_a_memory_cgroup_caps_what_is_available(tmp_path, cgroup, files, left):
    proc, root = fake(tmp_path, cgroup, files)
    assert fork_server.memory_available(proc, root) == left


@pytest.mark.parametrize("cgroup, files", [
    ("0::/user/carol\n", {"/sys/fs/cgroup/user/carol/memory.max": "max\n",
                          "/sys/fs/cgroup/user/carol/memory.current": "100\n"}),
    ("4:memory:/\n", {"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
                      "/sys/fs/cgroup/memory/memory.usage_in_bytes": "100\n"}),
    ("0::/\n", {}),  # no memory controller to read
])
def test_no_limit_leaves_the_machines_free_memory(tmp_path, monkeypatch, cgroup, files):
    import psutil

    proc, root = fake(tmp_path, cgroup, files)
    assert fork_server.memory_available(proc, root) <= psutil.virtual_memory().total
    assert fork_server.memory_available(proc, root) > 100 * 2 ** 20
