"""parlab.planner's block recomputation (``Plan.recompute_layers``): Megatron-LM's
``--recompute-granularity full --recompute-method block --recompute-num-layers K`` recomputes the
first K layers of each model chunk (megatron/core/recompute.py) and keeps the others' activations
whole.  Memory: the recomputed layers hold their input only; time: their share of a recomputed
forward, and of its collectives."""
from dataclasses import replace

import pytest

from parlab import planner, planner_frameworks
from parlab.planner import Cluster, ModelSpec, Plan, Workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

M = ModelSpec("7B", 7e9, 32, 4096, 32, 4096, ffn=11008, gated=True, dropout=False)
WORK = Workload(M, Cluster(32), 64)
FULL = Plan(dp=2, tp=4, pp=4, zero=1, micro_batch=1, accum=32, recompute="full")  # 8 layers per stage
NONE = replace(FULL, recompute="none")


def acts(plan, rank=1):  # a middle stage: no embedding, no logits
    return planner.stage_memory(plan, M, rank)["activations"]


def test_k_is_counted_per_model_chunk_and_capped_at_the_stage():
    assert planner.recomputed_share(replace(FULL, recompute_layers=2), 8) == 2 / 8
    inter = replace(FULL, v=2, recompute_layers=2)  # two chunks of 4 layers: 2 recomputed in each
    assert planner.recomputed_share(inter, 8) == 4 / 8
    assert planner.recomputed_share(replace(inter, recompute_layers=5), 8) == 1.0
    assert planner.recomputed_share(FULL, 8) == 1.0 and planner.recomputed_share(NONE, 8) == 0.0


@pytest.mark.parametrize("k", [1, 3, 6])
def test_recomputed_layers_hold_their_input_only_and_the_others_everything(k):
    held = 4 - 1  # 1F1B: stage 1 of 4 holds min(m, p - r) micro-batches
    layer_none, layer_full = acts(NONE) / (8 * held), (acts(FULL) - acts(NONE) / (8 * held)) / (8 * held)
    share = k / 8
    expect = (share * layer_full + (1 - share) * layer_none) * 8 * held + layer_none  # + the layer being redone
    assert acts(replace(FULL, recompute_layers=k)) == pytest.approx(expect, rel=1e-12)
    assert acts(FULL) < acts(replace(FULL, recompute_layers=k)) < acts(NONE)


def test_recomputing_every_layer_by_block_is_full_recomputation():
    every = replace(FULL, recompute_layers=8)
    assert planner.memory_breakdown(every, M) == planner.memory_breakdown(FULL, M)
    assert planner.step_time(every, WORK) == planner.step_time(FULL, WORK)


@pytest.mark.parametrize("k", [1, 4])
def test_compute_and_tp_grow_by_the_recomputed_share_of_a_forward(k):
    none, full = planner.step_time(NONE, WORK), planner.step_time(FULL, WORK)
    got = planner.step_time(replace(FULL, recompute_layers=k), WORK)
    for part in ("compute", "tp"):
        assert got[part] == pytest.approx(none[part] + k / 8 * (full[part] - none[part]), rel=1e-9), part
    assert none["total"] < got["total"] < full["total"]


def test_block_recomputation_needs_full_granularity_and_a_whole_number():
    with pytest.raises(ValueError, match="needs recompute=\"full\""):
        Plan(dp=1, tp=1, pp=1, recompute="none", recompute_layers=2)
    with pytest.raises(ValueError, match="recompute_layers must be a whole number"):
        Plan(dp=1, tp=1, pp=1, recompute="full", recompute_layers=-1)


def test_block_recomputation_runs_on_megatron_lm_only():
    block = replace(FULL, recompute_layers=3)
    assert planner_frameworks.runs_on(block) == "Megatron-LM"
    text = planner_frameworks.configuration(block, WORK)
    assert "--recompute-granularity full --recompute-method block --recompute-num-layers 3" in text
    fsdp = Plan(dp=32, tp=1, pp=1, zero=3, micro_batch=1, accum=2, recompute="full", recompute_layers=3)
    assert any("recompute_layers with ZeRO-3" in p for p in planner.problems(fsdp, WORK))


def test_fewest_recomputed_is_the_smallest_k_that_fits():
    tight = Workload(M, Cluster(32, memory=9e9), 64)  # 8.1 GB usable: none needs 9.8, full 5.9
    assert not planner.predict(NONE, tight).fits and planner.predict(FULL, tight).fits
    block = planner.fewest_recomputed(FULL, tight)
    assert block == replace(FULL, recompute_layers=4)  # 7.9 GB; 3 layers need 8.4
    assert planner.predict(block, tight).fits
    assert not planner.predict(replace(block, recompute_layers=3), tight).fits
    assert planner.fewest_recomputed(FULL, WORK) is None  # without recomputation it fits: that plan is faster
    assert planner.fewest_recomputed(NONE, tight) is None


def test_the_search_does_not_try_block_recomputation():
    # docs/planner.md: trying it made the search 1.6 times slower and changed the lecture's bands
    assert all(p.recompute_layers == 0 for p in planner.candidates(WORK))
