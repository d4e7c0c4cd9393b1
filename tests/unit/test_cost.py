"""parlab.cost: each formula against the figures published in the papers its docstring cites."""
import pytest
import torch
from torch import nn

from parlab import cost

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]
GB = 1e9


def test_weights_of_70b_in_bf16_exceed_one_h100():
    assert cost.weights_bytes(70e9, 2) == 140e9
    assert cost.weights_bytes(70e9, 2) > cost.H100_MEMORY
    assert cost.weights_bytes(10, cost.dtype_bytes("fp32")) == 40


def test_training_bytes_is_16_per_param():
    b = cost.training_bytes(1000)
    assert (b.weights, b.grads, b.optimizer, b.total) == (2000, 2000, 12000, 16000)
    assert cost.training_bytes(10, weight_bytes=4, grad_bytes=4, optim_bytes=8).total == 160


@pytest.mark.parametrize("stage, paper_gb", [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)])
def test_zero_paper_example_7_5b_at_64_gpus(stage, paper_gb):
    # ZeRO Fig. 1: exact values are 120, 31.406, 16.641, 1.875 GB; the paper rounds
    # to one decimal (1.875 -> 1.9), hence the 0.05 tolerance.
    got = cost.zero_memory_per_gpu(7.5e9, 64, stage) / GB
    assert got == pytest.approx(paper_gb, abs=0.05)


def test_zero_stages_by_formula():
    psi, nd = 1200, 8
    assert cost.zero_memory_per_gpu(psi, nd, 0) == 16 * psi
    assert cost.zero_memory_per_gpu(psi, nd, 1) == 4 * psi + 12 * psi / nd
    assert cost.zero_memory_per_gpu(psi, nd, 2) == 2 * psi + 14 * psi / nd
    assert cost.zero_memory_per_gpu(psi, nd, 3) == 16 * psi / nd
    # with one rank nothing is sharded
    assert {cost.zero_memory_per_gpu(psi, 1, s) for s in range(4)} == {16 * psi}


def test_gpt_params_matches_formula_and_a_real_block():
    v, h, L = 50257, 768, 12
    assert cost.gpt_params(v, h, L) == h * v + L * (12 * h * h + 13 * h) + 2 * h
    # GPT-2 small (tied embeddings) has 124,439,808 parameters; the formula
    # lacks only its 1024 x 768 position embeddings
    assert cost.gpt_params(v, h, L) + 1024 * h == 124_439_808

    # 12h^2 + 13h is exactly one GPT-2 block: LN, qkv, proj, LN, fc, proj (all with bias)
    h = 16
    block = nn.ModuleList([nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h),
                           nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)])
    assert cost.count_params(block) == cost.gpt_params(0, h, 1) - 2 * h


def test_count_params_counts_tied_weight_once():
    emb = nn.Embedding(11, 4)
    head = nn.Linear(4, 11, bias=False)
    head.weight = emb.weight
    model = nn.ModuleList([emb, head])
    assert cost.count_params(model) == 44
    head.weight = nn.Parameter(torch.zeros(11, 4))  # untied: now twice as many
    assert cost.count_params(model) == 88
    head.weight.requires_grad_(False)
    assert cost.count_params(model, trainable_only=True) == 44


def test_activation_memory_four_settings():
    s, b, h, a = 2048, 1, 4096, 32
    sbh = s * b * h
    full = sbh * (34 + 5 * a * s / h)
    assert cost.activation_bytes_per_layer(s, b, h, a) == full
    t = 8
    assert cost.activation_bytes_per_layer(s, b, h, a, t=t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert cost.activation_bytes_per_layer(s, b, h, a, t=t, sp=True) == pytest.approx(full / t)
    assert cost.activation_bytes_per_layer(s, b, h, a, t=t, recompute=True) == 2 * sbh
    # TP formula at t=1 collapses to the unparallelised one; SP saves more than TP alone
    assert cost.activation_bytes_per_layer(s, b, h, a, t=1) == full
    assert (cost.activation_bytes_per_layer(s, b, h, a, t=t, sp=True)
            < cost.activation_bytes_per_layer(s, b, h, a, t=t))


def test_dp_and_zero3_comm_exact_and_asymptote():
    psi = 1000
    assert cost.dp_comm_elems(psi, 1) == 0
    assert cost.dp_comm_elems(psi, 2) == psi  # reduce-scatter 500 + all-gather 500
    assert cost.dp_comm_elems(psi, 4) == 1500
    assert cost.dp_comm_elems(psi, 4, exact=False) == 2 * psi
    assert cost.zero3_comm_elems(psi, 4) == 2250
    assert cost.zero3_comm_elems(psi, 4, exact=False) == 3 * psi
    # ZeRO-3 moves 1.5x DP at every size; ZeRO-1/2 move the same as DP
    for n in (2, 3, 8, 64):
        assert cost.zero3_comm_elems(psi, n) == pytest.approx(1.5 * cost.dp_comm_elems(psi, n))
        assert cost.zero_comm_elems(psi, n, 2) == cost.dp_comm_elems(psi, n)
    assert cost.dp_comm_elems(psi, 10_000) == pytest.approx(2 * psi, rel=1e-3)


def test_tp_pp_comm():
    b, s, h = 2, 128, 64
    assert cost.tp_comm_elems_per_layer(b, s, h, 1) == 0
    assert cost.tp_comm_elems_per_layer(b, s, h, 4) == 8 * b * s * h * 3 / 4
    # 4 all-reduces of bsh, each 2(t-1)/t on a ring
    t = 8
    ring_ar = b * s * h * cost.busbw_factor("all_reduce", t)
    assert cost.tp_comm_elems_per_layer(b, s, h, t) == pytest.approx(4 * ring_ar)
    assert cost.pp_comm_elems(b, s, h) == b * s * h
    assert cost.comm_bytes(100, "bf16") == 200
    assert cost.comm_bytes(100, torch.float32) == 400
    assert cost.comm_bytes(100, 4) == 400


def test_bubble_definitions():
    p, m = 4, 8
    assert cost.bubble_fraction(p, m) == 3 / 11  # GPipe share (p-1)/(m+p-1)
    assert cost.bubble_fraction(p, m, definition="megatron") == 3 / 8  # (p-1)/m
    assert cost.bubble_fraction(p, m, "1f1b") == cost.bubble_fraction(p, m, "gpipe")
    assert cost.bubble_fraction(p, m, "interleaved", v=2, definition="megatron") == 3 / 16
    assert cost.bubble_fraction(p, m, "interleaved", v=2) == 3 / 19
    assert cost.bubble_fraction(p, m, "interleaved", v=1) == cost.bubble_fraction(p, m)
    assert cost.bubble_fraction(1, m) == 0
    for sched, v in (("gpipe", 1), ("interleaved", 3)):  # share = r / (1 + r)
        r = cost.bubble_fraction(p, m, sched, v=v, definition="megatron")
        assert cost.bubble_fraction(p, m, sched, v=v) == pytest.approx(r / (1 + r))


def test_pipeline_warmup_and_activations():
    assert [cost.pipeline_warmup(4, r) for r in range(4)] == [3, 2, 1, 0]
    # interleaved (Megatron-LM): 2(p − r − 1) + (v − 1)p chunk forwards, the schedule simulator's too
    from parlab.parallel.pp_schedule import warmup_forwards
    assert [cost.pipeline_warmup(4, r, v=2) for r in range(4)] == [10, 8, 6, 4]
    assert [warmup_forwards(4, 8, r, "interleaved", 2) for r in range(4)] == [10, 8, 6, 4]
    assert cost.activations_held(4, 16, "gpipe") == 16
    assert [cost.activations_held(4, 16, "1f1b", r) for r in range(4)] == [4, 3, 2, 1]
    assert cost.activations_held(4, 2, "1f1b") == 2  # never more than m


def test_busbw_factors_and_names():
    n = 8
    for name in ("all_reduce", "allreduce", "all-reduce", "AllReduce"):
        assert cost.busbw_factor(name, n) == 2 * 7 / 8
    for name in ("all_gather", "reduce_scatter", "all_to_all", "alltoall"):
        assert cost.busbw_factor(name, n) == 7 / 8
    assert cost.busbw_factor("broadcast", n) == cost.busbw_factor("reduce", n) == 1
    assert cost.busbw_factor("all_reduce", 1) == 0
    assert cost.algbw(1e9, 0.5) == 2e9
    assert cost.busbw("all_reduce", 1e9, 0.5, 4) == 2e9 * 1.5


def test_mfu_and_time_to_train():
    # 70B params, 15T tokens, 1024 H100 at 40% MFU:
    # 6 * 70e9 * 15e12 = 6.3e24 FLOPs; 1024 * 989e12 * 0.4 = 4.0509e17 FLOP/s
    # -> 1.5552e7 s = 180.0 days
    secs = cost.time_to_train(70e9, 15e12, 1024, cost.H100_BF16_PEAK, 0.4)
    assert secs == pytest.approx(6.3e24 / 4.050944e17)
    assert secs / cost.SECONDS_PER_DAY == pytest.approx(180.0, abs=0.05)

    assert cost.model_flops_per_token(1e9, 24, 2048, 2048) == 6e9 + 12 * 24 * 2048 * 2048
    # MFU inverts the time: running at the throughput implied by 40% MFU gives 0.4
    n, L, h, s, gpus = 7e9, 32, 4096, 4096, 64
    fpt = cost.model_flops_per_token(n, L, h, s)
    tps = 0.4 * gpus * cost.H100_BF16_PEAK / fpt
    assert cost.mfu(tps, n, L, h, s, gpus, cost.H100_BF16_PEAK) == pytest.approx(0.4)


@pytest.mark.parametrize("call, allowed", [
    (lambda: cost.zero_memory_per_gpu(10, 2, 4), "0, 1, 2, 3"),
    (lambda: cost.bubble_fraction(4, 8, "zigzag"), "'gpipe', '1f1b', 'interleaved'"),
    (lambda: cost.bubble_fraction(4, 8, definition="other"), "'share', 'megatron'"),
    (lambda: cost.busbw_factor("gather_all", 4), "all_reduce"),
    (lambda: cost.activations_held(4, 8, "zigzag"), "'gpipe', '1f1b', 'interleaved'"),
    (lambda: cost.dtype_bytes("fp7"), "bf16"),
])
def test_unknown_choices_name_allowed_values(call, allowed):
    with pytest.raises(ValueError, match="allowed") as e:
        call()
    assert allowed in str(e.value)


@pytest.mark.parametrize("call", [
    lambda: cost.weights_bytes(-1),
    lambda: cost.training_bytes(-5),
    lambda: cost.zero_memory_per_gpu(10, 0, 1),
    lambda: cost.dp_comm_elems(10, 0),
    lambda: cost.dp_comm_elems(-10, 2),
    lambda: cost.tp_comm_elems_per_layer(1, 1, -1, 2),
    lambda: cost.bubble_fraction(0, 8),
    lambda: cost.bubble_fraction(4, 8, "gpipe", v=2),
    lambda: cost.pipeline_warmup(4, 4),
    lambda: cost.busbw_factor("all_reduce", 0),
    lambda: cost.algbw(10, 0),
    lambda: cost.time_to_train(1, 1, 1, cost.H100_BF16_PEAK, 0),
    lambda: cost.activation_bytes_per_layer(1, 1, 1, 1, t=0),
])
def test_bad_input_raises(call):
    with pytest.raises(ValueError):
        call()


def test_cost_does_not_import_torch_at_module_level():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cost))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = {a.name.split(".")[0] for n in top for a in n.names} | {
        (n.module or "").split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert "torch" not in names


def test_interleaved_1f1b_holds_1_plus_p_minus_1_over_pv_on_stage_0():
    # Megatron-LM warm-up: 2(p-1) + (v-1)p chunks, each 1/v of a stage
    assert cost.activations_held(4, 16, "interleaved", 0, v=2) == pytest.approx(4 * (1 + 3 / 8))
    assert cost.activations_held(4, 1, "interleaved", 0, v=2) == 1  # never more than m


def test_flash_attention_drops_the_scores_term_and_megatron_sp_moves_10_units():
    sbh = 4096 * 8192
    assert cost.activation_bytes_per_layer(4096, 1, 8192, 64, scores=False) == 34 * sbh
    assert cost.activation_bytes_per_layer(4096, 1, 8192, 64, recompute="selective") == 34 * sbh
    assert cost.tp_comm_elems_per_layer(1, 4096, 8192, 8, sp=True) == 10 * sbh * 7 / 8
    assert cost.tp_comm_elems_per_layer(1, 4096, 8192, 8, recompute="full") == 12 * sbh * 7 / 8
    assert cost.model_state_bytes(1e9, 8, 1, "fp32_grads") == pytest.approx((6 + 12 / 8) * 1e9)


def _ring_chunks_sent(c: int, reverse_backward: bool) -> int:
    """Chunks one rank sends in a ring attention forward and backward, hop by hop."""
    sent = 2 * (c - 1)  # forward: K and V, c - 1 hops
    for step in range(c):
        if reverse_backward:  # TransformerEngine: K/V for c - 1 hops, dK/dV one hop behind
            sent += (2 if step < c - 1 else 0) + (2 if step > 0 else 0)
        else:  # lab 07's ring: K, V, dK, dV together, the last hop dK/dV only (home)
            sent += 4 if step < c - 1 else 2
    return sent


@pytest.mark.parametrize("c", [2, 3, 4, 8])
def test_cp_ring_bytes_count_each_hop_of_both_rings(c):
    b, s, h_kv = 2, 8 * c, 6
    chunk = b * (s // c) * h_kv
    assert cost.cp_comm_elems_per_layer(b, s, h_kv, c) == _ring_chunks_sent(c, False) * chunk
    assert cost.cp_comm_elems_per_layer(b, s, h_kv, c, reverse_backward=True) == _ring_chunks_sent(c, True) * chunk
    assert _ring_chunks_sent(c, False) == 6 * c - 4 and _ring_chunks_sent(c, True) == 6 * (c - 1)
    assert cost.cp_comm_elems_per_layer(b, s, h_kv, 1) == 0


def test_ep_all_to_all_bytes_count_the_rows_that_leave_the_rank():
    # balanced routing: tokens·top_k assignments spread evenly over the n ranks' experts
    tokens, h, top_k, n = 48, 5, 2, 4
    dest = torch.arange(tokens * top_k) % n  # the rank each assignment goes to
    for rank in range(n):
        leaving = int((dest != rank).sum())  # dispatch; combine sends back as many; backward twice more
        assert cost.ep_comm_elems_per_layer(tokens, h, top_k, n) == 4 * leaving * h
    assert cost.ep_comm_elems_per_layer(tokens, h, top_k, 1) == 0
    with pytest.raises(ValueError, match="top_k"):
        cost.ep_comm_elems_per_layer(tokens, h, 0, n)


def test_swiglu_gqa_and_no_dropout_are_counted_tensor_by_tensor():
    # Llama 2 70B's layer: h 8192, 64 heads, 8 K/V heads, SwiGLU 28,672 wide, no dropout, FlashAttention
    s, h, a, kv, f = 4096, 8192, 64, 8, 28672
    sbh = s * h
    two_matrix = cost.activation_bytes_per_layer(s, 1, h, a, scores=False, ffn=f)
    assert two_matrix == pytest.approx(sbh * (10 + 2 + 6 + 4 * f / h))  # Korthikanti's 34 with ffn/(4h)
    llama = cost.activation_bytes_per_layer(s, 1, h, a, scores=False, ffn=f, gated=True, kv_heads=kv, dropout=False)
    # norms 4 + inputs 4; Q 2, K and V 4·kv/a, attention output 2; gate, up and down inputs 3 × 2·f/h
    assert llama == pytest.approx(sbh * (8 + 2 + 4 * kv / a + 2 + 6 * f / h))
    assert llama > two_matrix  # the two-matrix count undercounts SwiGLU more than GQA and dropout save
    t = 8
    assert cost.activation_bytes_per_layer(s, 1, h, a, t=t, sp=True, scores=False, ffn=f, gated=True,
                                           kv_heads=kv, dropout=False) == pytest.approx(llama / t)
    # stored scores without dropout keep the softmax output alone: 2as/h instead of 5as/h
    assert (cost.activation_bytes_per_layer(s, 1, h, a, dropout=False)
            - cost.activation_bytes_per_layer(s, 1, h, a, dropout=False, scores=False)) == pytest.approx(
        sbh * 2 * a * s / h)
    with pytest.raises(ValueError, match="kv_heads"):
        cost.activation_bytes_per_layer(s, 1, h, a, kv_heads=0)


def test_the_three_ways_of_context_parallelism_send_and_hold_what_they_say():
    b, s, h, h_kv, c = 1, 32768, 4096, 1024, 4
    chunk = b * s / c * h_kv
    assert cost.cp_comm_elems_per_layer(b, s, h_kv, c, reverse_backward=True) == 4 * (c - 1) * chunk + 2 * (c - 1) * chunk
    # all-gather: K, V gathered in forward and again in backward; dK, dV reduce-scattered (TransformerEngine) or
    # passed c hops round the ring (torch's context_parallel)
    assert cost.cp_allgather_elems_per_layer(b, s, h_kv, c, "transformer_engine") == 6 * (c - 1) * chunk
    assert cost.cp_allgather_elems_per_layer(b, s, h_kv, c, "torch") == (4 * (c - 1) + 2 * c) * chunk
    assert cost.cp_allgather_elems_per_layer(b, s, h_kv, c, "torch") == cost.cp_comm_elems_per_layer(b, s, h_kv, c)
    with pytest.raises(ValueError, match="unknown implementation"):
        cost.cp_allgather_elems_per_layer(b, s, h_kv, c, "megatron")
    # Ulysses: four all-to-alls, each sending (c - 1)/c of the rank's Q, K, V (or O) block
    qkv, out = s / c * b * (h + 2 * h_kv), s / c * b * h
    assert cost.cp_alltoall_elems_per_layer(b, s, h, h_kv, c) == pytest.approx(2 * (c - 1) / c * (qkv + out))
    assert cost.cp_alltoall_elems_per_layer(b, s, h, h_kv, 8) < cost.cp_alltoall_elems_per_layer(b, s, h, h_kv, 4)
    assert cost.cp_allgather_elems_per_layer(b, s, h_kv, 1, "torch") == cost.cp_alltoall_elems_per_layer(b, s, h, h_kv, 1) == 0
    held = {m: cost.cp_kv_elems_held(b, s, h_kv, c, m) for m in ("ring", "all_gather", "all_to_all")}
    assert held == {"ring": 4 * chunk, "all_gather": 2 * b * s * h_kv, "all_to_all": 2 * chunk}
    with pytest.raises(ValueError, match="method must be one of"):
        cost.cp_kv_elems_held(b, s, h_kv, c, "p2p")


def test_zero_traffic_counts_the_micro_batches_of_a_step():
    psi, n, k = 1000, 4, 8
    one = 2 * (n - 1) * psi / n
    assert [cost.zero_comm_elems(psi, n, z) for z in range(4)] == [one, one, one, 1.5 * one]
    assert cost.zero_comm_elems(psi, n, 1, micro_batches=k) == one  # whole gradients accumulate locally
    assert cost.zero_comm_elems(psi, n, 2, micro_batches=k) == (k + 1) * (n - 1) * psi / n
    assert cost.zero_comm_elems(psi, n, 3, micro_batches=k) == k * 3 * (n - 1) * psi / n
    with pytest.raises(ValueError, match="micro_batches"):
        cost.zero_comm_elems(psi, n, 2, micro_batches=0)
