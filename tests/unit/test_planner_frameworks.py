"""parlab.planner_frameworks: every plan the planner returns is one a framework runs, and the
planner prints that framework's configuration.  One test per rule, with its source in the rule."""
import json

import pytest

from parlab import planner, planner_frameworks as F
from parlab.planner import ModelSpec, Plan, Workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

M7 = ModelSpec("7B", 7e9, 32, 4096, 32, 4096, ffn=11008)
WORK = Workload(M7, planner.Cluster(16), 64)


def _rule(name):
    return next(r for r in F.RULES if r.name == name)


@pytest.mark.parametrize("zero", [2, 3])
def test_no_framework_shards_gradients_under_pipeline_parallelism(zero):
    # DeepSpeed's PipelineEngine asserts stage < 2; torch's pipelining keeps FSDP's grads whole until
    # the last micro-batch: the plan is refused, with ZeRO-1 offered
    plan = Plan(dp=4, tp=2, pp=2, zero=zero, micro_batch=1, accum=16)
    assert _rule("sharded gradients under PP").breaks(plan)
    found = planner.problems(plan, WORK)
    assert any(f"ZeRO-{zero} with pp=2" in p and "use zero=1" in p for p in found), found
    assert not F.unrunnable(Plan(dp=4, tp=2, pp=2, zero=1, micro_batch=1, accum=16))
    assert not F.unrunnable(Plan(dp=8, tp=2, pp=1, zero=zero, micro_batch=1, accum=8))
    with pytest.raises(ValueError, match="no framework runs this plan"):
        F.configuration(plan, WORK)


def test_fsdp_with_tp_needs_sequence_parallelism():
    # torchtitan's TP plan puts SequenceParallel on the norms whenever TP is on
    plan = Plan(dp=8, tp=2, pp=1, zero=3, micro_batch=1, accum=8, sp=False)
    assert _rule("FSDP's TP without SP").breaks(plan)
    assert any("use sp=True" in p for p in planner.problems(plan, WORK))
    assert not F.unrunnable(Plan(dp=8, tp=2, pp=1, zero=1, micro_batch=1, accum=8, sp=False))  # Megatron


@pytest.mark.parametrize("plan", [Plan(dp=8, tp=2, pp=1, zero=1, accum=8, precision="zero16"),
                                  Plan(dp=4, tp=1, pp=4, zero=1, accum=16, v=2, precision="zero16"),
                                  Plan(dp=4, tp=1, pp=4, zero=2, accum=16, precision="zero16")])
def test_zero16_is_deepspeeds_accounting_and_runs_only_where_deepspeed_does(plan):
    assert _rule("zero16 beyond DeepSpeed").breaks(plan)
    assert any("fp32_grads" in p for p in planner.problems(plan, WORK))
    ok = Plan(dp=4, tp=1, pp=4, zero=1, accum=16, precision="zero16")
    assert F.runs_on(ok) == "DeepSpeed" and "num_stages=4" in F.configuration(ok, WORK)


def test_each_zero_stage_maps_to_the_framework_that_runs_it():
    assert F.runs_on(Plan(dp=2, tp=2, pp=4, zero=1, accum=32, cp=1)) == "Megatron-LM"
    assert F.runs_on(Plan(dp=16, tp=1, pp=1, zero=0, accum=4)) == "Megatron-LM"
    assert F.runs_on(Plan(dp=16, tp=1, pp=1, zero=2, accum=4)) == "DeepSpeed"
    assert F.runs_on(Plan(dp=8, tp=2, pp=1, zero=2, accum=8)) == "torchtitan"  # FSDP, no reshard after fwd
    assert F.runs_on(Plan(dp=4, tp=2, pp=1, zero=3, accum=8, cp=2)) == "torchtitan"


def test_configurations_carry_the_plan():
    long = Workload(ModelSpec("7B", 7e9, 30, 4096, 32, 32768, kv_heads=8), planner.Cluster(64), 64)
    mega = Plan(dp=2, tp=4, pp=4, zero=1, micro_batch=1, accum=32, cp=2, recompute="full")
    text = F.configuration(mega, long)
    for arg in ("--tensor-model-parallel-size 4", "--pipeline-model-parallel-size 4",
                "--context-parallel-size 2", "--micro-batch-size 1", "--global-batch-size 64",
                "--sequence-parallel", "--use-distributed-optimizer", "--recompute-granularity full",
                "--num-query-groups 8", "--pipeline-model-parallel-layout \"Et*8|t*8|t*7|t*7L\""):
        assert arg in text, (arg, text)
    inter = F.configuration(Plan(dp=1, tp=2, pp=4, zero=0, micro_batch=1, accum=8, v=2), WORK)
    assert "--num-layers-per-virtual-pipeline-stage 4" in inter and "layout" not in inter
    titan = F.configuration(Plan(dp=16, tp=4, pp=1, zero=2, micro_batch=2, accum=1, cp=1), long)
    for line in ("data_parallel_shard_degree = 16", "tensor_parallel_degree = 4",
                 'fsdp_reshard_after_forward = "never"', "local_batch_size = 2", "global_batch_size = 64"):
        assert line in titan, (line, titan)
    ds = F.configuration(Plan(dp=16, tp=1, pp=1, zero=2, micro_batch=2, accum=2), WORK)
    config = json.loads(ds[ds.index("{"):])
    assert config["zero_optimization"]["stage"] == 2 and config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 64 == 16 * 2 * 2


@pytest.mark.parametrize("name", list(planner.SCENARIOS))
def test_no_returned_plan_is_one_no_framework_runs(name):
    work = planner.SCENARIOS[name]
    assert not any(F.unrunnable(p) for p in planner.candidates(work))
    best = planner.search(work)
    if best is not None:
        assert F.runs_on(best.plan) in F.FRAMEWORKS and "framework" in best.plan.why
        assert F.configuration(best.plan, work)


def test_each_frameworks_sequence_parallelism_keeps_what_that_framework_keeps():
    from parlab import cost
    # torchtitan (ZeRO-2/3 with TP, pp = 1): the gathered inputs of the colwise projections are kept whole
    titan, megatron = Plan(dp=4, tp=4, pp=1, zero=3, micro_batch=1, accum=16), Plan(dp=4, tp=4, pp=1, zero=1,
                                                                                   micro_batch=1, accum=16)
    assert F.runs_on(titan) == "torchtitan" and F.sp_keeps_gathered(titan)
    assert F.runs_on(megatron) == "Megatron-LM" and not F.sp_keeps_gathered(megatron)
    assert not F.sp_keeps_gathered(Plan(dp=16, tp=1, pp=1, zero=3, micro_batch=1, accum=4))  # no TP, no SP
    assert not F.sp_keeps_gathered(Plan(dp=4, tp=2, pp=2, zero=2, micro_batch=1, accum=16))  # no torchtitan layout
    s, b, h, a, t = 4096, 1, 4096, 32, 4
    args = dict(t=t, sp=True, scores=False, **M7.shape)
    extra = cost.activation_bytes_per_layer(s, b, h, a, sp_gathered=True, **args) - \
        cost.activation_bytes_per_layer(s, b, h, a, **args)
    assert extra == pytest.approx(4 * s * b * h * (1 - 1 / t))  # attention's and the MLP's inputs, 2 + 2 units
    # full recomputation keeps the block's sequence-sharded input in both
    assert cost.activation_bytes_per_layer(s, b, h, a, sp_gathered=True, recompute="full", **args) == \
        cost.activation_bytes_per_layer(s, b, h, a, recompute="full", **args)
    # the planner counts the difference on every layer held
    diff = planner.memory_per_gpu(titan, M7) - planner.memory_per_gpu(megatron, M7)
    states = sum(planner.memory_breakdown(titan, M7)[k] - planner.memory_breakdown(megatron, M7)[k]
                 for k in ("weights", "grads", "optimizer"))
    assert diff - states == pytest.approx(extra * M7.layers)


def test_all_gather_cp_is_torchs_and_costs_the_rings_bytes():
    from parlab import cost
    long = ModelSpec("7B", 7e9, 32, 4096, 32, 32768, kv_heads=8)
    titan = Plan(dp=4, tp=1, pp=1, cp=4, zero=3, micro_batch=1, accum=4)
    assert F.cp_method(titan) == "all_gather" and F.runs_on(titan) == "torchtitan"
    chunk = 32768 / 4 * 1024  # one rank's K (or V) of b·(s/c)·h_kv elements
    assert cost.cp_allgather_elems_per_layer(1, 32768, 1024, 4, "torch") == 20 * chunk  # 6c − 4
    assert cost.cp_allgather_elems_per_layer(1, 32768, 1024, 4, "transformer_engine") == 18 * chunk  # 6(c − 1)
    # on a link slow enough that nothing hides, the planner's exposed CP time is torch's bytes over the link
    slow = Workload(long, planner.Cluster(16, nvlink_busbw=1e8, latency=0.0), 16)
    step = planner.step_time(titan, slow)
    assert step["cp"] == pytest.approx(20 * chunk * 2 / 1e8 * 32 * 4, rel=0.01)


def test_the_planner_is_one_package_whose_modules_import_one_another_one_way():
    # parlab.planner (the model and the search) -> .frameworks -> parlab.cost; .published -> the package;
    # .band -> the package, .frameworks, .published; the old top-level names are the same modules
    import ast
    from pathlib import Path

    from parlab import planner_band, planner_published
    pkg = Path(planner.__file__).resolve().parent
    assert pkg.name == "planner" and F is planner.frameworks and F.__name__ == "parlab.planner.frameworks"
    assert planner_band is planner.band and planner_published is planner.published

    def imports(module: str) -> set:
        found = set()
        for node in ast.walk(ast.parse((pkg / f"{module}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                names = {node.module} if node.module else {a.name for a in node.names}
                found |= {("." * node.level) + n for n in names}
        return found

    assert imports("frameworks") == {"..cost"}  # nothing of the planner
    assert imports("__init__") & {".band", ".published"} == set()
    assert ".band" not in imports("published")
