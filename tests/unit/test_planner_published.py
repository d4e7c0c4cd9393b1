"""parlab.planner against published training runs (``parlab.planner_published``), one set of
constants for all of them.  For each, the planner must accept the published layout, predict its
throughput within TOLERANCE, and find a best plan that keeps TP inside a node and is not more than
FASTER times faster than what the authors ran.  docs/planner.md shows the table
(``python tests/unit/test_planner_published.py`` prints it).
"""
import pytest

from parlab import planner as P, planner_frameworks
from parlab.planner_published import RUNS, error_band

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

TOLERANCE = 0.25  # predicted ÷ reported throughput within 1 ± this
FASTER = 1.75  # the planner's best plan ÷ the published layout (a known miss: ÷ its reported throughput), at most


IDS = [r.name for r in RUNS]
LLAMA_405B = [r for r in RUNS if r.name.startswith("Llama 3 405B")]


@pytest.fixture(scope="module")
def results():
    out = {}
    for r in RUNS:
        out[r.name] = (P.predict(r.plan, r.work), P.search(r.work))
    return out


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_the_published_layout_fits(run, results, request):
    # a known memory miss: strict, so that a layout the planner comes to fit fails until its miss is dropped
    if run.memory_miss:
        request.applymarker(pytest.mark.xfail(strict=True, reason="known memory miss, see docs/planner.md"))
    pred, _ = results[run.name]
    assert pred.fits, pred.problems


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_every_published_layout_runs_on_a_framework(run):
    assert planner_frameworks.runs_on(run.plan) in planner_frameworks.FRAMEWORKS + (planner_frameworks.NOT_PUBLIC,)


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_predicted_throughput_is_within_tolerance(run, results, request):
    # a known miss is one outside the band: strict, so that one which comes inside fails until its miss is dropped
    if run.miss:
        request.applymarker(pytest.mark.xfail(strict=True, reason="known miss, see docs/planner.md"))
    ratio = results[run.name][0].tokens_per_second / run.reported
    assert abs(ratio - 1) <= (error_band() if run.miss else TOLERANCE), f"predicted ÷ reported = {ratio:.2f}"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_the_planners_best_keeps_tp_in_a_node_and_is_not_much_faster(run, results):
    pred, best = results[run.name]
    assert best is not None and best.plan.tp <= run.work.cluster.gpus_per_node
    if not run.plan.stages and not run.memory_miss:  # a layout the search can express and that fits: it finds
        # at least that fast a plan
        assert best.tokens_per_second >= pred.tokens_per_second * (1 - 1e-9)
    # a known miss is compared with what its authors reached, not with a prediction off by more than the band
    published = run.reported if run.miss else pred.tokens_per_second
    assert best.tokens_per_second / published <= FASTER


def table() -> str:
    band = error_band()
    rows = [f"Error band (largest miss on the runs not marked as misses): ±{band:.0%}", "",
            "| run | published layout | checkpointing in the source | runs on | fits (GB) | predicted ÷ reported | "
            "within ±{:.0%} | planner's best ÷ published (a known miss: ÷ reported) |".format(band),
            "|---|---|---|---|---|---|---|---|"]
    for r in RUNS:
        pred, best = P.predict(r.plan, r.work), P.search(r.work)
        ratio = pred.tokens_per_second / r.reported
        inside = "yes" if abs(ratio - 1) <= band else "no (known miss)"
        rows.append(f"| {r.name} | {r.plan} | {r.published_ac} | {planner_frameworks.runs_on(r.plan)} | {'yes' if pred.fits else 'no'} "
                    f"({sum(pred.memory.values()) / 1e9:.1f}) | {ratio:.2f} | {inside} | "
                    f"{best.tokens_per_second / (r.reported if r.miss else pred.tokens_per_second):.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())


def test_the_llama_405b_memory_miss_is_written_with_its_figures():
    # planner_published.LLAMA_405B_MEMORY_MISS, recomputed: priced as trained (no checkpointing, Dubey et al.
    # 2024 §3.3.2), inside the band, but counted over the 80 GB of HBM; the count's parts
    from parlab import cost
    from parlab.planner_published import LLAMA_405B_MEMORY_MISS as MISS
    band = error_band()
    assert "without activation checkpointing" in MISS
    fits = []
    for run, gb, ratio, held in zip(LLAMA_405B, ("101.7", "87.6"), ("0.93", "0.91"), ("19.25", "16")):
        assert run.plan.recompute == "none" and not run.miss and run.published_ac.startswith("none")
        pred = P.predict(run.plan, run.work)
        assert not pred.fits and sum(pred.memory.values()) > run.work.cluster.memory
        assert f"{sum(pred.memory.values()) / 1e9:.1f}" == gb and gb in MISS
        assert f"{pred.tokens_per_second / run.reported:.2f}" == ratio and ratio in MISS
        assert abs(pred.tokens_per_second / run.reported - 1) <= band
        stage = max(range(run.plan.pp), key=lambda r: sum(P.stage_memory(run.plan, run.work.model, r).values()))
        n = P.stage_layers(run.plan, run.work.model)[stage]
        got = cost.activations_held(run.plan.pp, run.plan.accum, "interleaved", rank=stage, v=run.plan.v)
        assert f"{got:g}" == held and f"× its {n} layers" in MISS
        mem = P.stage_memory(run.plan, run.work.model, stage)
        per_layer = mem["activations"] / (n * got)
        states = mem["weights"] + mem["grads"] + mem["optimizer"]
        assert f"{per_layer / 1e6:.1f} MB per micro-batch" in MISS and f"{states / 1e9:.1f}" in MISS
        fits.append(f"{(run.work.cluster.memory - states) / (n * per_layer):.1f}")
    assert "the 19.25 and 16 micro-batches" in MISS and f"no more than {fits[0]} and {fits[1]} could be held" in MISS


def test_each_run_states_its_checkpointing_and_why_it_is_priced_so():
    from parlab.planner_published import (TITAN_8B_A100_AC, TITAN_8B_H100_MISS, titan_8b_a100_every_k,
                                          titan_8b_h100_readings)
    assert all(r.published_ac for r in RUNS)
    # torchtitan's modes as torchtitan names them: "selective op" is recompute="op", "selective layer" is
    # recompute="full" of every k-th layer (recompute_every)
    as_named = {"selective op": lambda p: p.recompute == "op", "selective layer": lambda p: p.recompute_every > 0}
    for r in RUNS:  # a mode the source does not name is explained
        named = next((ok for words, ok in as_named.items() if r.published_ac.startswith(words)), None)
        if named is not None:
            assert named(r.plan) and planner_framework_of(r) == "torchtitan", r.name
        elif r.published_ac.split()[0] != r.plan.recompute:
            assert r.priced_as.startswith(r.plan.recompute + ":"), r.name
    h100 = next(r for r in RUNS if r.published_ac.startswith("selective op"))
    a100 = next(r for r in RUNS if r.published_ac.startswith("selective layer"))
    # the H100 row priced as run: a known throughput miss at the SXM's peak, its figures in TITAN_8B_H100_MISS
    read = titan_8b_h100_readings()
    ratio = {k: f"{v.tokens_per_second / h100.reported:.2f}" for k, v in read.items()}
    gb = {k: sum(v.memory.values()) / 1e9 for k, v in read.items()}
    assert h100.miss == TITAN_8B_H100_MISS and abs(read["op"].tokens_per_second / h100.reported - 1) > error_band()
    assert f"predicts {ratio['op']}" in TITAN_8B_H100_MISS and f"it predicts {ratio['op at the NVL' + chr(39) + 's peak']}" \
        in TITAN_8B_H100_MISS
    measured = 82.4 * 2 ** 30 / 1e9
    assert f"counts {gb['op']:.1f} GB against {measured:.1f} GB (82.4 GiB) measured, {measured - gb['op']:.1f} GB " \
        "under" in TITAN_8B_H100_MISS
    assert not read["none"].fits and read["op"].fits and read["full"].fits
    assert f"{gb['none']:.1f} GB ({ratio['none']})" in TITAN_8B_H100_MISS
    assert f"{gb['full']:.1f} GB ({ratio['full']})" in TITAN_8B_H100_MISS
    m, b = h100.work.model, h100.plan.micro_batch
    logits = b * m.seq * m.vocab / 1e9
    assert f"{2 * logits:.1f} + {4 * logits:.1f} + {4 * logits:.1f} GB at the loss against the {4 * logits:.1f} GB" \
        in TITAN_8B_H100_MISS
    # the A100 row: every k predicts the same, as do none and op; its memory at the k chosen
    every = titan_8b_a100_every_k()
    assert len({f"{v.tokens_per_second / a100.reported:.6f}" for v in every.values()}) == 1
    assert f"predicts {every[1].tokens_per_second / a100.reported:.2f}" in TITAN_8B_A100_AC
    assert f"k = {a100.plan.recompute_every}" in TITAN_8B_A100_AC and f"from 1 to {a100.work.model.layers}" in TITAN_8B_A100_AC
    assert f"{P.memory_per_gpu(a100.plan, a100.work.model) / 1e9:.1f} GB" in TITAN_8B_A100_AC
    assert all(v.fits for v in every.values())


def planner_framework_of(run):
    return planner_frameworks.runs_on(run.plan)


def test_llama_3s_fsdp_read_as_zero2_still_does_not_fit_without_recomputation():
    from pathlib import Path

    from parlab.planner_published import llama_fsdp_zero2_reading
    doc = (Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text()
    for run in LLAMA_405B:
        got = llama_fsdp_zero2_reading(run)
        assert f"{got['GB without recomputation']:.1f} GB" in doc  # the figures docs/planner.md states
        assert got["GB without recomputation"] * 1e9 > run.work.cluster.usable_memory
        assert got["GB with full recomputation"] < P.memory_per_gpu(run.plan, run.work.model) / 1e9
        assert got["reduce-scatters per step"] == run.plan.accum > 1


def test_docs_state_the_software_era_with_the_tables_figures():
    from pathlib import Path

    from parlab import cost
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text().split())
    mfu = [r.reported * cost.model_flops_per_token(r.work.model.params, r.work.model.layers, r.work.model.hidden,
                                                   r.work.model.seq) / (r.work.cluster.gpus * r.work.cluster.peak_flops)
           for r in RUNS if r.name.startswith("Megatron-LM")]
    assert f"Megatron-LM's 2021 runs reached {min(mfu) * 100:.0f}-{max(mfu) * 100:.0f} % MFU on A100s" in doc
    assert f"lower `Cluster.best_mfu` to the best MFU that era published ({max(mfu):.2f} for the runs above)" in doc
    assert all(r.work.cluster.best_mfu > max(mfu) for r in RUNS)  # every cap is a later era's
