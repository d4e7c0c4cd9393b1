"""The pieces of DeepSeek-V3's training recipe the planner prices (DeepSeek-AI 2024, arXiv 2412.19437):
MLA's head widths and latent (§4.2), activations cached in FP8 with the norms and MLA's up-projections
recomputed (§3.2.3, §3.3.2), Adam's moments in bf16 (§3.3.3) and DualPipe (§3.2.1, Table 2).  Each is
checked against the count its docstring states, on small shapes; the published row itself is in
test_planner_moe.py."""
from dataclasses import replace

import pytest

from parlab import cost, planner as P, planner_frameworks as F
from parlab.planner import Cluster, ModelSpec, Plan, Workload

pytestmark = pytest.mark.unit

H, A = 1024, 8


def units(**kw) -> float:
    """Bytes per token of one layer, in units of h (s = b = 1, no TP)."""
    return cost.activation_bytes_per_layer(1, 1, H, A, scores=False, dropout=False, gated=True, ffn=2 * H, **kw) / H


def test_fp8_cache_keeps_what_deepseek_v3_says_it_keeps():
    # bf16: norm inputs 4, attention and MLP inputs 4, Q K V 6, attention output 2, SwiGLU 6·2
    assert units() == 4 + 4 + 6 + 2 + 12
    # fp8: norm outputs recomputed (the 4 go), E5M6 output 1.5, SwiGLU's inputs in FP8 (2·2), output recomputed
    assert units(cache="fp8") == 4 + 6 + 1.5 + 4
    # a GeLU MLP: 4·width in bf16, its activation's input alone in FP8
    gelu = dict(scores=False, dropout=False, ffn=4 * H)
    assert cost.activation_bytes_per_layer(1, 1, H, A, cache="fp8", **gelu) / H == 4 + 6 + 1.5 + 4
    # full recomputation keeps the layer's input whatever the cache
    assert units(recompute="full", cache="fp8") == units(recompute="full") == 2
    with pytest.raises(ValueError, match="unknown cache 'fp4'"):
        units(cache="fp4")


def test_mla_heads_and_latent_are_counted():
    # Q and K 8·192/1024 = 1.5 h wide, V and the output 8·128/1024 = 1 h; latent 512 = h/2
    mla = dict(qk_dim=192, v_dim=128, latent=512)
    assert units(**mla) == 4 + 4 + (2 * 1.5 + 2 * (1.5 + 1) + 2 * 0.5) + 2 * 1 + 12
    # up-projections recomputed: the latent alone, in FP8; the output in E5M6 at its own width
    assert units(cache="fp8", **mla) == 4 + 0.5 + 1.5 * 1 + 4
    # the defaults are heads of width h/a: the count is the one before MLA existed
    assert units(qk_dim=H / A, v_dim=H / A) == units()


def test_mla_widens_the_attention_flops():
    m = ModelSpec("mla", 1e9, 8, H, A, 2048, qk_head_dim=192, v_head_dim=128)
    assert m.attention_width == A * (192 + 128) / 2
    assert ModelSpec("mha", 1e9, 8, H, A, 2048).attention_width == H
    plan = Plan(dp=8, tp=1, pp=1)
    mha = replace(m, qk_head_dim=0, v_head_dim=0)
    for causal, share in ((False, 1), (True, 1 / 2)):  # full attention, as the default model times it; a fused causal kernel
        fwd = P.layer_flops(plan, m, "none", causal)[0] - P.layer_flops(plan, mha, "none", causal)[0]
        assert fwd == pytest.approx(4 * (A * 160 - H) * 2048 * share)


def test_bf16_moments_are_fourteen_bytes_and_run_on_megatron_with_zero_1():
    assert cost.PRECISIONS["bf16_moments"] == (2, 4, 8)
    assert cost.model_state_bytes(1e9, 1, 0, "bf16_moments") == 14e9
    m = ModelSpec("m", 1e9, 8, H, A, 2048)
    work = Workload(m, Cluster(8), 64)
    plan = Plan(dp=8, tp=1, pp=1, zero=1, micro_batch=1, accum=8, precision="bf16_moments")
    assert F.runs_on(plan) == "Megatron-LM"
    assert "--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16" in F.configuration(plan, work)
    assert any("precision-aware distributed optimizer" in why for why in F.unrunnable(replace(plan, zero=3)))
    fp32 = P.memory_breakdown(replace(plan, precision="fp32_grads"), m)
    assert P.memory_breakdown(plan, m)["optimizer"] == pytest.approx(fp32["optimizer"] * 8 / 12)


MOE = ModelSpec("moe", 8e9, 8, H, A, 2048, experts=16, top_k=2, expert_ffn=2 * H, gated=True)
STAGED = Plan(dp=8, tp=1, pp=4, zero=1, micro_batch=1, accum=16, ep=8, ep_overlap=True)


def test_dualpipe_bubble_memory_and_rules_as_table_2_gives_them():
    work = Workload(MOE, Cluster(32), 128)
    dual = replace(STAGED, schedule="dualpipe")
    one, two = P.step_time(STAGED, work), P.step_time(dual, work)
    # (PP/2 − 1)·2/3 of a micro-batch's stage time against 1F1B's (PP − 1)
    assert two["bubble"] == pytest.approx(one["bubble"] * (4 / 2 - 1) * 2 / 3 / (4 - 1))
    assert P.bubble_stages(dual) == pytest.approx(2 / 3) and P.bubble_stages(STAGED) == 3
    # the pipeline's sends hide behind what the all-to-all leaves of the computation
    assert one["pp"] > 0 and two["pp"] <= one["pp"]
    a, b = P.stage_memory(STAGED, MOE, 0), P.stage_memory(dual, MOE, 0)
    assert b["weights"] == pytest.approx(2 * a["weights"]) and b["grads"] == pytest.approx(2 * a["grads"])
    assert b["optimizer"] == pytest.approx(a["optimizer"])
    per_microbatch = a["activations"] / cost.activations_held(4, 16, "1f1b", rank=0)
    assert b["activations"] == pytest.approx(per_microbatch * (4 + 1))  # PP + 1
    for bad in (dict(pp=3, dp=8), dict(accum=15), dict(v=2)):
        with pytest.raises(ValueError, match="dualpipe"):
            replace(dual, **bad)
    assert F.runs_on(dual) == F.runs_on(replace(STAGED, act_cache="fp8")) == F.NOT_PUBLIC
    assert "DualPipe" in str(dual) and "FP8-cached activations" in str(replace(STAGED, act_cache="fp8"))


def test_the_search_never_generates_the_recipe():
    work = Workload(MOE, Cluster(32), 128)
    found = list(P.candidates(work))
    assert found and all(p.schedule == "1f1b" and p.act_cache == "bf16" and p.precision == "fp32_grads" for p in found)
