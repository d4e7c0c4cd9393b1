"""parlab.calculator: the widgets follow the sliders, show the planner's numbers and say why a layout fails."""
import matplotlib
import pytest

from parlab import planner
from parlab.calculator import calculator, report

matplotlib.use("Agg")
pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


def test_it_starts_on_the_best_plan_of_the_scenario():
    calc = calculator("70B on 64 H100s")
    best = planner.search(planner.SCENARIOS["70B on 64 H100s"]).plan
    assert (calc.tp.value, calc.cp.value, calc.pp.value, calc.zero.value, calc.recompute.value) == \
        (best.tp, best.cp, best.pp, best.zero, best.recompute)
    assert calc.recompute.value in ("none", "selective", "full")
    assert calc.summary.value.startswith("<b>fits</b>") and "busiest GPU" in calc.summary.value
    assert "of the 72 GB a plan may use (90% of 80 GB)" in calc.summary.value
    time = planner.predict(best, planner.SCENARIOS["70B on 64 H100s"]).time
    assert f"bubble {time['bubble']:.2f}" in calc.summary.value and f"MFU cap {time['cap']:.2f}" in calc.summary.value
    assert time["cp"] == 0 and "CP" not in calc.summary.value  # a part that is zero is left out
    assert "busiest GPU" in calc.last_figure.axes[0].get_xlabel()
    bars = calc.last_figure.axes[0].patches
    assert [round(b.get_width(), 3) for b in bars] == \
        [round(v / 1e9, 3) for v in planner.memory_breakdown(best, planner.SCENARIOS["70B on 64 H100s"].model).values()]


def test_a_slider_change_redraws_and_names_what_does_not_fit():
    calc = calculator("70B on 64 H100s")
    calc.pp.value, calc.zero.value, calc.recompute.value = 1, 0, "none"
    assert "does not fit" in calc.summary.value and "activations" in calc.summary.value
    assert "over the 72 GB a plan may use" in calc.summary.value
    before = calc.summary.value
    calc.recompute.value = "full"
    assert calc.summary.value != before and "full recompute" in calc.last_figure.axes[0].get_title()
    calc.tp.value = 3
    assert "tp·pp = 3 does not divide the 64 GPUs" in calc.summary.value and calc.last_figure is None


def test_switching_scenario_loads_it_and_says_when_nothing_fits():
    calc = calculator("7B on 8 H100s")
    calc.scenario.value = "70B on 8 H100s"
    assert calc.params.value == pytest.approx(70e9) and calc.gpus.value == 8
    assert "No layout fits" in calc.summary.value


def test_time_to_train_is_shown_for_the_15t_scenario():
    calc = calculator("70B on 15T tokens (2048 H100s)")
    assert "time to train on 1.5e+13 tokens" in calc.summary.value and "days" in calc.summary.value
    work = planner.SCENARIOS["70B on 15T tokens (2048 H100s)"]
    days = planner.time_to_train(planner.search(work).plan, work) / 86400
    assert f"{days:,.1f} days" in calc.summary.value


def test_a_custom_workload_with_odd_sizes_starts():
    work = planner.Workload(planner.ModelSpec("13B", 13e9, 40, 5120, 40, 4096),
                            planner.Cluster(12, gpus_per_node=6), 96)
    calc = calculator(work)
    assert calc.gpus.value == 12 and calc.summary.value.startswith("<b>fits</b>")


def test_a_scenario_keeps_its_vocabulary_and_kv_heads():
    calc = calculator("70B on 64 H100s")
    model = calc.workload().model
    assert (model.vocab, model.ffn, model.kv_heads) == (32000, 28672, 8)


def test_a_micro_batch_that_does_not_divide_a_replicas_rows_is_named():
    calc = calculator("7B on 8 H100s")
    calc.tp.value, calc.pp.value, calc.micro.value = 1, 1, 64  # dp = 8: 32 rows each
    assert "does not divide the global batch of 256" in calc.summary.value
    assert "global_batch / dp rows" in calc.summary.value and calc.last_figure is None


def test_report_lists_every_problem():
    work = planner.SCENARIOS["7B on 8 H100s"]
    _, text = report(planner.Plan(dp=1, tp=16, pp=1, micro_batch=1, accum=256), work)
    assert text.count("✗") == 2 and "inside a node" in text and "cluster has 8 GPUs" in text


def test_the_step_line_adds_up_with_the_mfu_cap_named():
    import re
    work = planner.SCENARIOS["70B on 64 H100s"]
    best = planner.search(work)
    _, text = report(best.plan, work)
    line = next(x for x in text.split("<br>") if x.startswith("step "))
    total, *parts = (float(v) for v in re.findall(r"\d+\.\d+", line))
    assert best.time["cap"] > 0 and "+ MFU cap" in line
    assert sum(parts) == pytest.approx(total, abs=0.01 * len(parts))


def test_bad_start_is_refused():
    with pytest.raises(ValueError, match="unknown scenario"):
        calculator("7B on 9 GPUs")
    with pytest.raises(TypeError, match="scenario name or a planner.Workload"):
        calculator(7)
