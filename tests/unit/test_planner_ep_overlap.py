"""parlab.planner's overlapped expert-parallel all-to-all (``Plan.ep_overlap``): the all-to-alls run
beside another micro-batch's computation (DeepSeek-V3's DualPipe, DeepSeek-AI 2024 §3.2.1; Megatron-LM's
``--overlap-moe-expert-parallel-comm``), only what exceeds that computation is exposed, and the
computation runs on the SMs the all-to-all kernels leave it (20 of 132, §3.5.1)."""
from dataclasses import replace

import pytest

from parlab import planner as P, planner_frameworks as F
from parlab.planner import Cluster, ModelSpec, Plan, Workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

MOE = ModelSpec("moe", 2.1e9, 8, 1024, 8, 2048, gated=True, dropout=False, experts=8, top_k=2,
                expert_ffn=1024, shared_experts=1)
PLAN = Plan(dp=16, tp=1, pp=1, zero=1, micro_batch=1, accum=4, ep=8)


def times(plan, work):
    return P.step_time(plan, work), P.step_time(replace(plan, ep_overlap=True), work)


@pytest.mark.parametrize("busbw", [370e9, 1e9])  # EP inside a node: all-to-all shorter than the computation, longer
def test_only_the_all_to_all_beyond_the_slowed_computation_is_exposed(busbw):
    work = Workload(MOE, Cluster(16, nvlink_busbw=busbw), 64)
    bare, over = times(PLAN, work)
    assert bare["ep"] > 0
    assert over["compute"] == pytest.approx(bare["compute"] / (1 - 20 / 132), rel=1e-12)
    assert over["ep"] == pytest.approx(max(0.0, bare["ep"] - over["compute"]), rel=1e-12)
    slow = busbw < 10e9
    assert (over["ep"] > 0) == slow
    # overlapping pays off only where the all-to-all is long: the SMs it takes slow the computation
    assert (over["total"] < bare["total"]) == slow


def test_overlap_needs_expert_parallelism():
    with pytest.raises(ValueError, match="needs ep > 1"):
        Plan(dp=16, tp=1, pp=1, zero=1, ep_overlap=True)


def test_megatron_lm_runs_the_overlap_only_with_a_virtual_pipeline_and_no_full_recomputation():
    work = Workload(MOE, Cluster(16), 64)
    staged = Plan(dp=8, tp=1, pp=2, zero=1, micro_batch=1, accum=8, ep=8, v=2, ep_overlap=True)
    assert F.runs_on(staged) == "Megatron-LM"
    assert "--overlap-moe-expert-parallel-comm --delay-wgrad-compute" in F.configuration(staged, work)
    for other in (replace(staged, v=1), replace(staged, recompute="full"),
                  replace(staged, recompute="full", recompute_layers=1)):
        assert F.runs_on(other) == F.NOT_PUBLIC and "no public configuration" in F.configuration(other, work)
    assert F.runs_on(replace(staged, ep_overlap=False, v=1, recompute="full")) == "Megatron-LM"


def test_the_search_never_overlaps():
    # priced for the published DeepSeek-V3 row only (docs/planner.md)
    assert not any(p.ep_overlap for p in P.candidates(Workload(MOE, Cluster(16), 64)))
