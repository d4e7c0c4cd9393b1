"""Checks for Lab 06: coordinates on a device mesh, sub-group collectives, 2-D training.

    lab06.check_coords(coords)                 # Exercise 1a: rank -> (p, d, t), TP innermost
    lab06.check_rank_of(rank_of)               # Exercise 1b: (p, d, t) -> rank
    lab06.check_groups(groups)                 # Exercise 1c: the groups of ranks along an axis
    lab06.check_axis_all_reduce(axis_all_reduce)   # Exercise 2a: all-reduce along one axis, new_group
    lab06.check_mesh_all_reduce(mesh_all_reduce)   # Exercise 2b: the same with a DeviceMesh
    lab06.check_sync_dp_grads(sync_dp_grads)   # Exercise 3: average gradients over the DP group only
    lab06.check_memory_per_gpu(memory_per_gpu) # Exercise 4: bytes per GPU under a plan
    lab06.check_choose(choose)                 # Exercise 5: the planner

The coordinate exercises are pure functions, graded without a launch, on
many mesh shapes (``coords``).  The all-reduces run on 4 ranks (2 × 2,
4 × 1, 1 × 4) and, hidden (not the DeviceMesh one), on 2 (2 × 1, 1 × 2); a spy notes which
groups were created and which group each collective used
(``subgroups``).  ``sync_dp_grads`` trains parlab's GPT on such meshes
against one process (``sync``).  The strategy planner of the lab's
later sections is graded by ``planner``.
"""
from __future__ import annotations

from ..harness import checker
from .coords import COORDS, GROUPS, RANK_OF
from .planner import CHOOSE, MEMORY, check_choose, check_memory_per_gpu
from .subgroups import AXIS, MESH
from .sync import SYNC

__all__ = ["check_coords", "check_rank_of", "check_groups", "check_axis_all_reduce",
           "check_mesh_all_reduce", "check_sync_dp_grads", "check_memory_per_gpu", "check_choose",
           "EXERCISES"]

EXERCISES = {"coords": COORDS, "rank_of": RANK_OF, "groups": GROUPS, "axis": AXIS, "mesh": MESH,
             "sync": SYNC, "memory": MEMORY, "choose": CHOOSE}

check_coords = checker(COORDS, """Exercise 1a: ``coords(rank, pp, dp, tp)`` -> (p, d, t) with TP
innermost: rank = p·(dp·tp) + d·tp + t.""")
check_rank_of = checker(RANK_OF, """Exercise 1b: ``rank_of(p, d, t, pp, dp, tp)`` -> the rank at
(p, d, t), the inverse of ``coords``.""")
check_groups = checker(GROUPS, """Exercise 1c: ``groups(axis, pp, dp, tp)`` -> every group of ranks
along ``axis`` ("pp", "dp" or "tp"): the ranks that share the other two coordinates.""")
check_axis_all_reduce = checker(AXIS, """Exercise 2a: ``axis_all_reduce(t, axis, dp, tp)`` sums ``t``
in place over this rank's group along ``axis`` of a dp × tp mesh, with ``dist.new_group``.""")
check_mesh_all_reduce = checker(MESH, """Exercise 2b: ``mesh_all_reduce(t, axis, dp, tp)``: the same
with ``init_device_mesh`` and ``mesh.get_group(axis)``.""")
check_sync_dp_grads = checker(SYNC, """Exercise 3: ``sync_dp_grads(model, dp_group)`` averages every
gradient over ``dp_group`` only.""")
