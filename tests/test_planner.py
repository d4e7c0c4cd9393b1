"""parlab.planner: the memory and step-time model of a (dp, tp, pp) plan, its rules and its search."""
import math

import pytest

from parlab import cost, planner
from parlab.planner import Cluster, ModelSpec, Plan, Workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

M7 = ModelSpec("7B", 7e9, 32, 4096, 32, 4096)


@pytest.mark.parametrize("stage,gb", [(0, 120), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_model_states_reproduce_the_zero_papers_75b_on_64_gpus(stage, gb):
    model = ModelSpec("7.5B", 7.5e9, 32, 4096, 32, 1)
    parts = planner.memory_breakdown(Plan(dp=64, tp=1, pp=1, zero=stage), model)
    states = parts["weights"] + parts["grads"] + parts["optimizer"]
    assert round(states / 1e9, 1) == gb


def test_activations_follow_korthikanti_table_2_and_1f1b():
    # s=4096, b=2, h=4096, a=32, t=4: sbh(10 + 24/t + 5as/(ht)) per layer
    sbh = 4096 * 2 * 4096
    per_layer = sbh * (10 + 24 / 4 + 5 * 32 * 4096 / (4096 * 4))
    plan = Plan(dp=1, tp=4, pp=4, micro_batch=2, accum=3)  # 1F1B stage 0 holds min(3, 4) = 3
    assert planner.memory_breakdown(plan, M7)["activations"] == pytest.approx(per_layer * 8 * 3)
    recompute = Plan(dp=1, tp=4, pp=4, micro_batch=2, accum=9, recompute=True)  # 2sbh, min(9, 4)
    assert planner.memory_breakdown(recompute, M7)["activations"] == pytest.approx(2 * sbh * 8 * 4)


def test_model_states_are_split_by_tp_and_pp_before_zero_divides_by_dp():
    parts = planner.memory_breakdown(Plan(dp=4, tp=2, pp=2, zero=1), M7)
    shard = 7e9 / 4
    assert (parts["weights"], parts["grads"], parts["optimizer"]) == pytest.approx(
        (2 * shard, 2 * shard, 12 * shard / 4))


def test_seventy_b_on_eight_gpus_cannot_fit_whatever_the_layout():
    work = planner.SCENARIOS["70B on 8 H100s"]
    assert cost.training_bytes(70e9).total == 1120e9 > work.cluster.gpus * work.cluster.memory
    assert planner.search(work) is None


@pytest.mark.parametrize("name", list(planner.SCENARIOS))
def test_the_search_returns_the_fastest_plan_that_fits(name):
    work = planner.SCENARIOS[name]
    best = planner.search(work)
    fitting = [planner.predict(p, work) for p in planner.candidates(work) if not planner.problems(p, work)]
    if best is None:
        assert not fitting
        return
    assert best.fits and sum(best.memory.values()) <= work.cluster.memory
    assert best.tokens_per_second == pytest.approx(max(f.tokens_per_second for f in fitting), rel=1e-12)
    assert set(best.plan.why) == {"dp", "tp", "pp", "zero"}


def test_every_candidate_uses_every_gpu_and_the_whole_batch():
    work = Workload(M7, Cluster(12, gpus_per_node=6), 96)
    plans = list(planner.candidates(work))
    assert plans and all(p.dp * p.tp * p.pp == 12 and p.dp * p.micro_batch * p.accum == 96 for p in plans)
    assert {p.tp for p in plans} == {1, 2, 3, 4, 6, 12}


@pytest.mark.parametrize("plan,gpus,words", [
    (Plan(dp=2, tp=2, pp=1, zero=3, micro_batch=1, accum=32, recompute=True), 8, "the cluster has 8 GPUs"),
    (Plan(dp=1, tp=16, pp=1, micro_batch=1, accum=64, recompute=True), 16, "does not fit inside a node of 8 GPUs"),
    (Plan(dp=2, tp=1, pp=3, zero=3, micro_batch=1, accum=32, recompute=True), 6, "does not divide the 32 layers"),
    (Plan(dp=8, tp=1, pp=1, zero=3, micro_batch=1, accum=3, recompute=True), 8, "the global batch is 64"),
    (Plan(dp=8, tp=1, pp=1, micro_batch=8, accum=1), 8, "over the 80 GB"),
])
def test_problems_name_each_broken_rule(plan, gpus, words):
    found = planner.problems(plan, Workload(M7, Cluster(gpus), 64))
    assert len(found) == 1 and words in found[0], found


def test_heads_must_divide_by_tp():
    odd = ModelSpec("odd", 1e9, 12, 1536, 12, 1024)
    assert any("12 attention heads" in p for p in
               planner.problems(Plan(dp=1, tp=8, pp=1, micro_batch=8), Workload(odd, Cluster(8), 8)))


def test_an_axis_that_leaves_the_node_pays_network_speed():
    work = Workload(M7, Cluster(16), 64)
    inside = planner.step_time(Plan(dp=2, tp=8, pp=1, micro_batch=1, accum=32), work)
    across = planner.step_time(Plan(dp=1, tp=16, pp=1, micro_batch=1, accum=64), work)
    tp_bytes = lambda t, accum: cost.tp_comm_elems_per_layer(1, 4096, 4096, t) * 32 * accum * 2
    assert inside["tp"] == pytest.approx(tp_bytes(8, 32) / 450e9)
    assert across["tp"] == pytest.approx(tp_bytes(16, 64) / 50e9)
    dp_inside = planner.step_time(Plan(dp=8, tp=1, pp=1, micro_batch=8), Workload(M7, Cluster(8), 64))
    assert dp_inside["dp"] == pytest.approx(cost.dp_comm_elems(7e9, 8) * 2 / 450e9)


def test_recompute_and_the_bubble_scale_compute():
    work = Workload(M7, Cluster(8), 64)
    base = planner.step_time(Plan(dp=8, tp=1, pp=1, micro_batch=1, accum=8), work)["compute"]
    flops = 64 * 4096 * cost.model_flops_per_token(7e9, 32, 4096, 4096)
    assert base == pytest.approx(flops / (8 * 989e12 * 0.5))
    again = planner.step_time(Plan(dp=8, tp=1, pp=1, micro_batch=1, accum=8, recompute=True), work)
    assert again["compute"] == pytest.approx(base * 4 / 3)
    piped = planner.step_time(Plan(dp=2, tp=1, pp=4, micro_batch=1, accum=32), work)["compute"]
    assert piped == pytest.approx(base * (1 + 3 / 32))


def test_time_to_train_scales_steps():
    work = planner.SCENARIOS["70B on 15T tokens (2048 H100s)"]
    best = planner.search(work)
    steps = 15e12 / (work.global_batch * work.model.seq)
    assert planner.time_to_train(best.plan, work) == pytest.approx(steps * best.time["total"])
    with pytest.raises(ValueError, match="tokens"):
        planner.time_to_train(best.plan, planner.SCENARIOS["7B on 8 H100s"])


@pytest.mark.parametrize("make,words", [
    (lambda: ModelSpec("x", -1, 2, 8, 2, 8), "params must be > 0"),
    (lambda: ModelSpec("x", 1e6, 0, 8, 2, 8), "layers must be a whole number"),
    (lambda: Plan(dp=1, tp=1, pp=1, zero=4), "zero must be one of"),
    (lambda: Plan(dp=1.5, tp=1, pp=1), "dp must be a whole number"),
    (lambda: Cluster(8, efficiency=1.5), "efficiency must be in"),
    (lambda: Workload(M7, Cluster(8), 0), "global_batch must be a whole number"),
])
def test_bad_input_gets_a_clear_error(make, words):
    with pytest.raises(ValueError, match=words):
        make()


def test_plans_compare_by_layout_not_by_their_reasons():
    assert Plan(2, 2, 2, why={"dp": "a"}) == Plan(2, 2, 2) and not math.isnan(hash(Plan(2, 2, 2)))
