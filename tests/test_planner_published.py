"""parlab.planner v2 against published training runs, one set of constants for all of them.

Each run: its model shape, GPUs, layout and reported throughput, converted to tokens/s the
way its authors count FLOPs.  For each, the planner must accept the published layout,
predict its throughput within TOLERANCE, and find a best plan that keeps TP inside a node
and is not more than FASTER times faster than what the authors ran.  docs/planner.md
shows the table (``python tests/test_planner_published.py`` prints it).
Sources:
  Megatron-LM: Narayanan et al. 2021 (arXiv 2104.04473), Table 1: A100 80 GB, seq 2048,
    V = 51,200, full recomputation; TFLOP/s by their eq. (3), 96·B·s·l·h²(1 + s/6h + V/16lh),
    which counts the recomputed forward.  2021 attention stored its scores.
  Llama 3: Dubey et al. 2024 (arXiv 2407.21783), Table 4: 405B, TP 8, PP 16, seq 8192,
    H100 80 GB; TFLOP/s counted as model FLOPs (here 6N + 12·L·h·s, PaLM app. B).
  torchtitan docs/performance.md: Llama 3.1 8B on 8 H100s (96 GB HBM2e), FSDP, local batch 2,
    5,762 tokens/s/GPU (commit 47d1825, Jan 2025); Llama 3 8B and 70B with FSDP on 64 A100
    80 GB, 2,904 and 331 tokens/s/GPU (commit 1d5815c, Oct 2024).
"""
import pytest

from parlab import planner as P
from parlab.planner import ModelSpec, Plan, Workload

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

TOLERANCE = 0.25  # predicted ÷ reported throughput within 1 ± this
FASTER = 1.75  # the planner's best plan ÷ the published layout, at most


def _megatron(name, params, heads, h, l, tp, pp, gpus, batch, tflops):
    m = ModelSpec(f"GPT {name}", params * 1e9, l, h, heads, 2048, vocab=51200, tied=True, scores=True)
    dp = gpus // (tp * pp)
    flops = 96 * l * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * l * h))  # per token, eq. (3)
    return dict(name=f"Megatron-LM {name}, {gpus} A100s (Narayanan 2021, Table 1)",
                work=Workload(m, P.A100_80GB(gpus), batch),
                plan=Plan(dp=dp, tp=tp, pp=pp, zero=0, micro_batch=1, accum=batch // dp, recompute="full",
                          sp=False),
                reported=tflops * 1e12 * gpus / flops)


L405 = ModelSpec("Llama 3 405B", 405e9, 126, 16384, 128, 8192, vocab=128256, ffn=53248, kv_heads=8)
L8 = ModelSpec("Llama 3 8B", 8.03e9, 32, 4096, 32, 8192, vocab=128256, ffn=14336, kv_heads=8)
L70 = ModelSpec("Llama 3 70B", 70.6e9, 80, 8192, 64, 8192, vocab=128256, ffn=28672, kv_heads=8)


def _palm(m):
    return 6 * m.params + 12 * m.layers * m.hidden * m.seq


def _llama(gpus, dp, per_dp, tflops):
    # first and last stage one layer fewer (Dubey et al. 2024 §3.3.2); interleaved schedule (v=4 assumed);
    # full recomputation: the only mode under which the layout fits this planner's 34·sbh per layer
    return dict(name=f"Llama 3 405B, {gpus:,} H100s (Dubey 2024, Table 4)",
                work=Workload(L405, P.H100_SXM(gpus), dp * per_dp),
                plan=Plan(dp=dp, tp=8, pp=16, zero=1, micro_batch=1, accum=per_dp, recompute="full",
                          stages=(7,) + (8,) * 14 + (7,), v=4),
                reported=tflops * 1e12 * gpus / _palm(L405), miss=True)


RUNS = [
    _megatron("1.7B", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    _megatron("18.4B", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    _megatron("145.6B", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    _megatron("1T", 1008, 160, 25600, 128, 8, 64, 3072, 3072, 163),
    _llama(8192, 64, 32, 430),
    _llama(16384, 128, 16, 400),
    dict(name="torchtitan Llama 3.1 8B, FSDP, 8 H100s", work=Workload(L8, P.H100_SXM(8, memory=96e9), 16),
         plan=Plan(dp=8, tp=1, pp=1, zero=3, micro_batch=2, accum=1, recompute="full"), reported=5762 * 8),
    dict(name="torchtitan Llama 3 8B, FSDP, 64 A100s", work=Workload(L8, P.A100_80GB(64), 64),
         plan=Plan(dp=64, tp=1, pp=1, zero=3, micro_batch=1, accum=1, recompute="none"), reported=2904 * 64),
    dict(name="torchtitan Llama 3 70B, FSDP, 64 A100s", work=Workload(L70, P.A100_80GB(64), 64),
         plan=Plan(dp=64, tp=1, pp=1, zero=3, micro_batch=1, accum=1, recompute="full"), reported=331 * 64),
]
IDS = [r["name"] for r in RUNS]


@pytest.fixture(scope="module")
def results():
    out = {}
    for r in RUNS:
        out[r["name"]] = (P.predict(r["plan"], r["work"]), P.search(r["work"]))
    return out


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_the_published_layout_fits(run, results):
    pred, _ = results[run["name"]]
    assert pred.fits, pred.problems


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_predicted_throughput_is_within_tolerance(run, results, request):
    if run.get("miss"):
        request.applymarker(pytest.mark.xfail(strict=True, reason="known miss, see docs/planner.md"))
    ratio = results[run["name"]][0].tokens_per_second / run["reported"]
    assert abs(ratio - 1) <= TOLERANCE, f"predicted ÷ reported = {ratio:.2f}"


@pytest.mark.parametrize("run", RUNS, ids=IDS)
def test_the_planners_best_keeps_tp_in_a_node_and_is_not_much_faster(run, results):
    pred, best = results[run["name"]]
    assert best is not None and best.plan.tp <= run["work"].cluster.gpus_per_node
    if not run["plan"].stages:  # a layout the search can express: it finds at least that fast a plan
        assert best.tokens_per_second >= pred.tokens_per_second * (1 - 1e-9)
    assert best.tokens_per_second / pred.tokens_per_second <= FASTER


def table() -> str:
    rows = ["| run | published layout | fits (GB) | predicted ÷ reported | planner's choice | GB | ÷ published |",
            "|---|---|---|---|---|---|---|"]
    for r in RUNS:
        pred, best = P.predict(r["plan"], r["work"]), P.search(r["work"])
        rows.append(f"| {r['name']} | {r['plan']} | {'yes' if pred.fits else 'no'} "
                    f"({sum(pred.memory.values()) / 1e9:.1f}) | {pred.tokens_per_second / r['reported']:.2f} | "
                    f"{best.plan} | {sum(best.memory.values()) / 1e9:.1f} | "
                    f"{best.tokens_per_second / pred.tokens_per_second:.2f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table())
