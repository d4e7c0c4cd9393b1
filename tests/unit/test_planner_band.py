"""parlab.planner_band: the plans within the planner's measured error of its best, each layout at
its own best micro-batch and recomputation; the error measured on the published runs."""
import pytest

from parlab import planner, planner_band, planner_published

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def bands():
    return {name: planner_band.band(work) for name, work in planner.SCENARIOS.items()}


def test_the_error_band_is_the_largest_miss_on_the_covered_published_runs():
    found = planner_published.ratios()
    covered = [abs(found[r.name] - 1) for r in planner_published.RUNS if not r.miss]
    assert planner_published.error_band() == max(covered) and len(covered) >= 5
    assert 0 < planner_published.error_band() < 0.25
    assert all(r.miss for r in planner_published.RUNS if abs(found[r.name] - 1) > planner_published.error_band())


@pytest.mark.parametrize("name", [n for n in planner.SCENARIOS if "2048" not in n])
def test_the_band_holds_every_layout_within_the_error_once_at_its_best(name, bands):
    work, got = planner.SCENARIOS[name], bands[name]
    if got is None:
        assert planner.search(work) is None
        return
    best = planner.search(work)
    assert got.best.prediction.tokens_per_second == pytest.approx(best.tokens_per_second, rel=1e-12)
    fastest = {}
    for plan in planner.candidates(work):
        if not planner.problems(plan, work):
            key = planner_band.layout_key(plan)
            fastest[key] = max(fastest.get(key, 0), planner.predict(plan, work).tokens_per_second)
    floor = best.tokens_per_second * (1 - got.error)
    inside = {k: v for k, v in fastest.items() if v >= floor}
    # the same degrees that several frameworks run at the same prediction are one layout, naming them all
    shapes = {}
    for k, v in inside.items():
        shapes.setdefault((k[:-1], round(v, 3)), set()).add(k[-1])
    assert len(got.choices) == len(shapes)
    for c in got.choices:
        key = planner_band.layout_key(c.plan)
        assert c.prediction.tokens_per_second == pytest.approx(fastest[key], rel=1e-12)
        named = {part.split(":")[0] for part in c.notes["framework"].split("; ")}
        assert named == shapes[(key[:-1], round(fastest[key], 3))]
        if len(named) > 1:  # each framework with its own setting and memory margin
            assert c.notes["framework"].count("GB left") == len(named)
        assert set(c.notes) == {"margin", "framework", "axes across nodes", "stages"}
    shares = [c.share for c in got.choices]
    assert shares == sorted(shares, reverse=True) and shares[0] == 1


def test_seventy_b_on_64_is_a_band_priced_as_each_framework_runs_it(bands):
    got = bands["70B on 64 H100s"]
    assert len(got.choices) > 3  # no single winner
    megatron = got.find(dp=4, tp=4, pp=4, zero=1, v=1)  # TP inside the node, PP across, ZeRO-1: Megatron-LM
    assert megatron is not None and "plans within" in str(got)
    # torchtitan's TP 8 × FSDP keeps the gathered inputs of its colwise projections: at micro-batch 4 without
    # recomputation it no longer fits, and its best runnable form (full recomputation) falls outside the band
    work = planner.SCENARIOS["70B on 64 H100s"]
    assert got.find(dp=8, tp=8, pp=1, zero=3) is None and got.find(dp=8, tp=8, pp=1, zero=2) is None
    old = planner.predict(planner.Plan(dp=8, tp=8, pp=1, zero=3, micro_batch=4, accum=32), work)
    assert not old.fits and [p.kind for p in old.problems] == ["memory"]
    every = planner_band.band(work, error=0.999)
    titan = every.find(dp=8, tp=8, pp=1)
    assert titan.notes["framework"] == "torchtitan" and titan.plan.recompute == "full" and titan.share < 1 - got.error
    fsdp = got.find(dp=64, tp=1, pp=1)  # FSDP without TP: no gathered inputs, inside the band
    assert fsdp is not None and fsdp.notes["framework"] == "torchtitan"
    # docs/planner.md names the practitioners' recipes and where they sit
    from pathlib import Path
    doc = " ".join((Path(__file__).resolve().parents[2] / "docs" / "planner.md").read_text().split())
    nemo = planner.predict(planner.Plan(dp=4, tp=4, pp=4, zero=1, v=5, micro_batch=1,
                                        accum=work.global_batch // 4), work)
    assert f"the band holds {len(got.choices)} layouts" in doc and "llama3_70b.py" in doc and "llama3_70b.toml" in doc
    assert f"dp 4 × tp 4 × pp 4 with ZeRO-1, is at {megatron.share:.3f} of the fastest" in doc
    assert f"at {nemo.tokens_per_second / got.best.prediction.tokens_per_second:.3f}" in doc
    assert f"needs {sum(old.memory.values()) / 1e9:.1f} GB" in doc
    assert f"micro-batch {titan.plan.micro_batch}, is at {titan.share:.3f} of the fastest" in doc
    assert f"dp 64 with ZeRO-3 and full recomputation at {fsdp.share:.3f}" in doc
    # under torchtitan's op-level checkpointing (opt-in to the search) that layout fits at micro-batch 4
    from dataclasses import replace
    op = planner_band.band(replace(work, op_sac=True)).find(dp=8, tp=8, pp=1)
    assert op is not None and op.plan.recompute == "op" and op.notes["framework"] == "torchtitan"
    assert f"fits at micro-batch {op.plan.micro_batch} ({sum(op.prediction.memory.values()) / 1e9:.1f} GB) and is " \
        f"at {op.prediction.tokens_per_second / got.best.prediction.tokens_per_second:.3f} of the fastest" in doc


def test_a_layout_is_counted_once_whatever_zero_stage_gives_the_same_prediction(bands):
    # 1.3B on 8 at micro-batch 2: Megatron-LM's ZeRO-0 and ZeRO-1 predict the same throughput (DP hidden behind
    # the backward): one layout, not two; FSDP's ZeRO-3 of the same degrees runs on torchtitan, another layout
    work = planner.SCENARIOS["1.3B fits one GPU (8 H100s)"]
    z0, z1, z3 = (planner.Plan(dp=8, tp=1, pp=1, zero=z, micro_batch=2, accum=32) for z in (0, 1, 3))
    p0, p1 = planner.predict(z0, work), planner.predict(z1, work)
    assert p0.fits and p1.fits and p0.tokens_per_second == pytest.approx(p1.tokens_per_second, rel=1e-12)
    assert planner_band.layout_key(z0) == planner_band.layout_key(z1) != planner_band.layout_key(z3)
    assert planner.simplicity(z1) < planner.simplicity(z0)  # the band keeps ZeRO-1 of a tie
    for got in filter(None, bands.values()):
        keys = [planner_band.layout_key(c.plan) for c in got.choices]
        assert len(keys) == len(set(keys))


def test_bad_error_gets_a_clear_error():
    with pytest.raises(ValueError, match=r"error must be in \[0, 1\)"):
        planner_band.band(planner.SCENARIOS["7B on 8 H100s"], error=1.5)
