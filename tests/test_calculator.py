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
    assert (calc.tp.value, calc.pp.value, calc.zero.value, calc.recompute.value) == \
        (best.tp, best.pp, best.zero, best.recompute)
    assert calc.summary.value.startswith("<b>fits</b>")
    bars = calc.last_figure.axes[0].patches
    assert [round(b.get_width(), 3) for b in bars] == \
        [round(v / 1e9, 3) for v in planner.memory_breakdown(best, planner.SCENARIOS["70B on 64 H100s"].model).values()]


def test_a_slider_change_redraws_and_names_what_does_not_fit():
    calc = calculator("70B on 64 H100s")
    calc.recompute.value = False
    assert "does not fit" in calc.summary.value and "activations" in calc.summary.value
    calc.tp.value = 3
    assert "tp·pp = 48 does not divide the 64 GPUs" in calc.summary.value and calc.last_figure is None


def test_switching_scenario_loads_it_and_says_when_nothing_fits():
    calc = calculator("7B on 8 H100s")
    calc.scenario.value = "70B on 8 H100s"
    assert calc.params.value == pytest.approx(70e9) and calc.gpus.value == 8
    assert "No layout fits" in calc.summary.value


def test_time_to_train_is_shown_for_the_15t_scenario():
    calc = calculator("70B on 15T tokens (2048 H100s)")
    assert "time to train on 1.5e+13 tokens" in calc.summary.value and "days" in calc.summary.value


def test_a_custom_workload_with_odd_sizes_starts():
    work = planner.Workload(planner.ModelSpec("13B", 13e9, 40, 5120, 40, 4096),
                            planner.Cluster(12, gpus_per_node=6), 96)
    calc = calculator(work)
    assert calc.gpus.value == 12 and "fits" in calc.summary.value


def test_report_lists_every_problem():
    work = planner.SCENARIOS["7B on 8 H100s"]
    _, text = report(planner.Plan(dp=1, tp=16, pp=1, micro_batch=1, accum=256), work)
    assert text.count("✗") == 2 and "inside a node" in text and "cluster has 8 GPUs" in text


def test_bad_start_is_refused():
    with pytest.raises(ValueError, match="unknown scenario"):
        calculator("7B on 9 GPUs")
    with pytest.raises(TypeError, match="scenario name or a planner.Workload"):
        calculator(7)
