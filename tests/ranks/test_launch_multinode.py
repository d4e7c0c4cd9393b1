"""nnodes=2 without Slurm: two torchrun agents on this machine meet at one c10d rendezvous.

The ranks also read their node layout from torchrun's variables
(``parlab.parallel.node_layout``), as the mesh and the planner do.
"""
import os
import time

import psutil
import pytest

import parlab
from parlab.launch import jobdir

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


def where():
    import torch
    import torch.distributed as dist

    from parlab.parallel.mesh import Mesh
    from parlab.parallel.node_layout import NodeLayout
    from parlab.planner import Cluster

    t = torch.ones(1) * dist.get_rank()
    dist.all_reduce(t)
    env = {k: int(os.environ[k]) for k in ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                           "WORLD_SIZE")}
    layout = NodeLayout.from_env()  # what this rank's launch says about its nodes
    seen = {"layout": layout, "node": layout.node_of(dist.get_rank()),
            "placement": Mesh.on_nodes(layout, dp=2, tp=2).placement(layout),
            "cluster": (Cluster.from_launch().gpus, Cluster.from_launch().gpus_per_node)}
    return env, t.item(), os.getppid(), os.getpid(), seen


def node_one_fails(path):
    import torch.distributed as dist

    with open(f"{path}.{dist.get_rank()}", "w") as f:
        f.write(str(os.getpid()))
    if int(os.environ["GROUP_RANK"]) == 1 and int(os.environ["LOCAL_RANK"]) == 0:
        time.sleep(1)
        os._exit(7)  # node 1 loses a rank; node 0's ranks wait in the barrier
    dist.barrier()
    time.sleep(300)


def _launch_processes(root):
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(jobdir.JOB_ENV, "").startswith(root):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_two_agents_number_their_nodes_and_local_ranks():
    got = parlab.launch(where, nproc=4, nnodes=2)
    envs = [e for e, _, _, _, _ in got]
    assert [e["RANK"] for e in envs] == [0, 1, 2, 3]
    assert all(e["WORLD_SIZE"] == 4 and e["LOCAL_WORLD_SIZE"] == 2 for e in envs)
    assert sorted(e["GROUP_RANK"] for e in envs) == [0, 0, 1, 1]
    assert all(e["RANK"] == e["GROUP_RANK"] * 2 + e["LOCAL_RANK"] for e in envs), envs
    assert all(total == 6.0 for _, total, _, _, _ in got)  # 0+1+2+3 across both nodes
    agents = {e["GROUP_RANK"]: ppid for e, _, ppid, _, _ in got}
    assert agents[0] != agents[1], "both nodes' ranks were started by the same torchrun agent"
    # the mesh and the planner see the real 2 nodes of 2 ranks, and each rank its own node
    for e, _, _, _, seen in got:
        assert (seen["layout"].nnodes, seen["layout"].per_node) == (2, 2), seen
        assert seen["node"] == e["GROUP_RANK"]
        assert seen["placement"] == {"pp": 1, "dp": 2, "tp": 1}  # TP inside a node, DP across
        assert seen["cluster"] == (4, 2)


def test_one_nodes_failure_ends_the_other_nodes_ranks(tmp_path):
    marks = tmp_path / "pid"
    started = time.monotonic()
    with pytest.raises(parlab.WorkerError) as info:
        parlab.launch(node_one_fails, args=(str(marks),), nproc=4, nnodes=2, timeout=120)
    assert time.monotonic() - started < 60, "the other node's ranks waited for the timeout"
    assert info.value.rank == 2 and "exited with code 7" in str(info.value), str(info.value)
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert len(pids) == 4
    time.sleep(1)
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert not _launch_processes(jobdir.jobs_root())
