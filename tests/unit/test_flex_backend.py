"""The flex backend (FlexAttention score_mod built from each scheme's DistanceKernel) against the
reference backend, and its refusals.

CPU is inference only. Every scheme runs through flex's eager path (same score_mod and mask_mod,
no compile); the compiled CPU kernel, what the backend runs by default, is checked on one scheme
because each new score_mod costs a C++ compile (~20 s cold on 2 cores, ~3 s with a warm inductor
cache). CUDA tests (training, parameter gradients) run only where a GPU is present."""
import pytest
import torch

from megatron.attention import resolve_backend
from megatron.attention.flex import FlexAttention
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme, scheme_names

CPU, F32 = torch.device("cpu"), torch.float32
B, H = 2, 4
# rpe_max_distance 5 < the largest distance 8, so the T5 lookup's clamp is exercised.
SPEC = PositionalSpec(num_heads=H, head_dim=8, hidden_size=H * 8, max_position_embeddings=64,
                      options={"rpe_num_buckets": 8, "rpe_max_distance": 5})
# (Lq, Lk, offset, window): full rows, kv-cache rows (queries = the last Lq keys), positions far
# from 0, a sliding window, and all of those at once.
CASES = [(9, 9, 0, None), (3, 9, 0, None), (9, 9, 1000, None), (9, 9, 0, 4), (3, 9, 50, 4)]
CASE_IDS = [f"Lq{c[0]}-Lk{c[1]}-off{c[2]}-W{c[3]}" for c in CASES]


def make_scheme(name, spec=SPEC):
    torch.manual_seed(0)
    scheme = build_scheme(name, spec)
    with torch.no_grad():  # trained-looking parameters, not only the init draw
        for p in scheme.parameters():
            p.mul_(1.3)
    return scheme


FUSED = [n for n in scheme_names() if make_scheme(n).fused_kernel() is not None]


def inputs(case, head_dim, device=CPU, seed=0, kv_heads=H):
    """q (B, H, Lq, D), k and v (B, kv_heads, Lk, D) (grouped-query attention below H), positions."""
    lq, lk, offset, _ = case
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, heads, n, head_dim, generator=g).to(device)
               for heads, n in ((H, lq), (kv_heads, lk), (kv_heads, lk)))
    k_pos = torch.arange(lk, device=device) + offset
    return q, k, v, k_pos[lk - lq:], k_pos


def assert_inference_matches(backend, scheme, case, dtype=F32, tol=1e-4, kv_heads=H):
    """Against the fp32 reference on the same (dtype-rounded) inputs: max error / max |want|."""
    q, k, v, q_pos, k_pos = (x.to(dtype) if x.is_floating_point() else x
                             for x in inputs(case, SPEC.head_dim, kv_heads=kv_heads))
    reference = resolve_backend("reference", scheme, CPU, F32, False)
    with torch.no_grad():
        got = backend.forward(q, k, v, scheme, q_pos, k_pos, window=case[3])
        want = reference.forward(q.float(), k.float(), v.float(), scheme, q_pos, k_pos, window=case[3])
    assert got.dtype == dtype
    err = (got.float() - want).abs().max() / want.abs().max()
    assert err <= tol, f"{scheme.name} {case} {dtype}: relative error {err:.2e} > {tol}"


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("name", FUSED)
def test_cpu_inference_matches_reference_every_scheme(name):
    scheme = make_scheme(name)
    backend = resolve_backend("flex", scheme, CPU, F32, False)
    backend.eager_on_cpu = True
    for case in CASES:
        assert_inference_matches(backend, scheme, case)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv2", "kv1"])
@pytest.mark.parametrize("name", ["kerple_log", "rpe"])
def test_cpu_grouped_query_matches_reference(name, kv_heads):
    """k, v with fewer heads (enable_gqa): score_mod's head index stays the query head, so a
    per-head bias (KERPLE's parameters, T5's table columns) lands on the right query heads."""
    scheme = make_scheme(name)
    backend = resolve_backend("flex", scheme, CPU, F32, False)
    backend.eager_on_cpu = True
    for case in CASES:
        assert_inference_matches(backend, scheme, case, kv_heads=kv_heads)


@pytest.mark.parametrize("case,dtype,tol,kv_heads", [
    ((3, 9, 0, None), F32, 1e-4, H), ((3, 9, 1000, 4), F32, 1e-4, H),
    # bf16 guards a torch 2.13 CPU miscompile (a score_mod ending in .to(score.dtype) was off by ~2)
    ((3, 9, 1000, 4), torch.bfloat16, 1e-2, H),
    # grouped-query k, v (enable_gqa) in the compiled kernel, what "auto" runs for long CPU inference
    ((3, 9, 1000, 4), F32, 1e-4, 2),
], ids=["kv-rows", "kv-rows-off1000-W4", "kv-rows-off1000-W4-bf16", "kv-rows-off1000-W4-gqa"])
def test_cpu_compiled_matches_reference(case, dtype, tol, kv_heads):
    # One shape, so one compile per dtype (and head layout); the score_mod with the most terms:
    # weight and bias d**p.
    scheme = make_scheme("kerple_power_ap_ap")
    backend = resolve_backend("flex", scheme, CPU, dtype, False)
    assert not backend.eager_on_cpu
    assert_inference_matches(backend, scheme, case, dtype, tol, kv_heads=kv_heads)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_window_and_offset_change_the_result():
    # Guards the comparisons above against a backend that ignores window / offset.
    scheme = make_scheme("kerple_log")
    backend = resolve_backend("flex", scheme, CPU, F32, False)
    backend.eager_on_cpu = True
    q, k, v, q_pos, k_pos = inputs((9, 9, 0, None), SPEC.head_dim)
    with torch.no_grad():
        full = backend.forward(q, k, v, scheme, q_pos, k_pos)
        windowed = backend.forward(q, k, v, scheme, q_pos, k_pos, window=4)
        rows = backend.forward(q[:, :, 6:], k, v, scheme, q_pos[6:], k_pos)
    assert not torch.allclose(full, windowed)
    torch.testing.assert_close(rows, full[:, :, 6:], rtol=1e-5, atol=1e-6)  # kv rows = last rows


def test_refuses_cpu_training():
    with pytest.raises(ValueError) as err:
        resolve_backend("flex", make_scheme("kerple_log"), CPU, F32, True)
    msg = str(err.value)
    assert "'flex'" in msg and "no CPU backward" in msg and "inference only" in msg
    supported = msg.split("Backends that support it:")[1]
    assert "sdpa" in supported and "reference" in supported and "flex" not in supported


def test_refuses_dropout():
    with pytest.raises(ValueError) as err:
        resolve_backend("flex", make_scheme("kerple_log"), CPU, F32, False, dropout=True)
    msg = str(err.value)
    assert "no attention-probability dropout" in msg
    supported = msg.split("Backends that support it:")[1]
    assert "sdpa" in supported and "reference" in supported and "flex" not in supported


def test_cpu_forward_with_grad_is_refused():
    scheme = make_scheme("kerple_log")
    backend = resolve_backend("flex", scheme, CPU, F32, False)
    q, k, v, q_pos, k_pos = inputs(CASES[0], SPEC.head_dim)
    with pytest.raises(ValueError, match="inference only.*torch.no_grad"):
        backend.forward(q.requires_grad_(), k, v, scheme, q_pos, k_pos)


@pytest.mark.parametrize("q_pos,k_pos,match", [
    (torch.tensor([0, 2, 3]), torch.arange(4), "consecutive positions"),
    (torch.arange(3), torch.arange(4) + 1, "precedes the first key"),
])
def test_bad_positions(q_pos, k_pos, match):
    scheme = make_scheme("kerple_log")
    backend = resolve_backend("flex", scheme, CPU, F32, False)
    q, k, v = torch.randn(1, H, 3, 8), torch.randn(1, H, 4, 8), torch.randn(1, H, 4, 8)
    with torch.no_grad(), pytest.raises(ValueError, match=match):
        backend.forward(q, k, v, scheme, q_pos, k_pos)


def test_auto_never_picks_flex_on_cpu_and_ranks_it_on_cuda():
    assert resolve_backend("auto", make_scheme("kerple_log"), CPU, F32, False).name == "sdpa"
    # sdpa cannot multiply scores; flex could on CPU but is never auto-picked there.
    assert resolve_backend("auto", make_scheme("kerple_power_ap_ap"), CPU, F32, False).name != "flex"
    flex, cuda = FlexAttention(), torch.device("cuda")
    assert flex.auto_rank(make_scheme("kerple_log"), cuda, torch.bfloat16, True) == 30
    assert flex.auto_rank(make_scheme("rotary"), cuda, torch.bfloat16, True) is None  # SDPA's flash path
    assert flex.auto_rank(make_scheme("kerple_log"), CPU, F32, False) is None


# ---- CUDA: training, gradients of q, k, v and the scheme's parameters -----------------------
GPU_SPEC = PositionalSpec(num_heads=H, head_dim=16, hidden_size=H * 16, max_position_embeddings=64,
                          options={"rpe_num_buckets": 8, "rpe_max_distance": 5})  # Triton's dot needs head_dim >= 16


def run_with_grads(backend, scheme, q, k, v, q_pos, k_pos, window, grad_out):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    qr, kr = scheme.rotate_qk(q, k, q_pos, k_pos)
    out = backend.forward(qr, kr, v, scheme, q_pos, k_pos, window=window)
    params = [p for p in scheme.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out.float() * grad_out).sum(), [q, k, v] + params, allow_unused=True)
    return [out.detach()] + list(grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex training runs on CUDA only")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", FUSED)
def test_cuda_training_matches_reference(name, dtype, tol, monkeypatch):
    # Every scheme and dtype compiles its own graph; keep them all compiled (no eager fallback).
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 256)
    cuda = torch.device("cuda")
    scheme = make_scheme(name, GPU_SPEC).to(cuda)
    flex = resolve_backend("flex", scheme, cuda, dtype, True)
    reference = resolve_backend("reference", scheme, cuda, F32, True)
    for i, case in enumerate(CASES):
        q, k, v, q_pos, k_pos = inputs(case, GPU_SPEC.head_dim, cuda, seed=i)
        q, k, v = (x.to(dtype) for x in (q, k, v))  # the reference sees the same rounded inputs
        grad_out = torch.randn(B, H, case[0], GPU_SPEC.head_dim, device=cuda)
        got = run_with_grads(flex, scheme, q, k, v, q_pos, k_pos, case[3], grad_out)
        want = run_with_grads(reference, scheme, q.float(), k.float(), v.float(), q_pos, k_pos, case[3], grad_out)
        names = ["out", "dq", "dk", "dv"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
        for i, (label, g, w) in enumerate(zip(names, got, want)):
            assert (g is None) == (w is None), label
            if w is not None:
                # Flex rounds P to bf16 before P @ V, so its backward's rowsum(dO * O) is not exactly
                # sum P dP; a parameter gradient sums whole rows of dS, which cancel, and keeps that
                # error (1.13e-2 on an H100 for kerple_log_3para's bias_a). Our Triton kernel avoids
                # it (EXACT_PV); flex is PyTorch's kernel, so its parameter gradients get 2x the room.
                allowed = 2 * tol if dtype != F32 and i >= 4 else tol
                err = (g.float() - w).abs().max() / w.abs().max().clamp_min(1e-6)
                assert err <= allowed, f"{name} {case} {label}: relative error {err:.2e} > {allowed}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex training runs on CUDA only")
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv2", "kv1"])
def test_cuda_grouped_query_training_matches_reference(kv_heads, monkeypatch):
    """Grouped-query k, v (enable_gqa) in CUDA training: dk, dv summed over each group, KERPLE's
    parameter gradients per query head."""
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 256)
    cuda = torch.device("cuda")
    scheme = make_scheme("kerple_log", GPU_SPEC).to(cuda)
    flex = resolve_backend("flex", scheme, cuda, F32, True)
    reference = resolve_backend("reference", scheme, cuda, F32, True)
    for i, case in enumerate((CASES[0], CASES[4])):
        q, k, v, q_pos, k_pos = inputs(case, GPU_SPEC.head_dim, cuda, seed=i, kv_heads=kv_heads)
        grad_out = torch.randn(B, H, case[0], GPU_SPEC.head_dim, device=cuda)
        got = run_with_grads(flex, scheme, q, k, v, q_pos, k_pos, case[3], grad_out)
        want = run_with_grads(reference, scheme, q, k, v, q_pos, k_pos, case[3], grad_out)
        names = ["out", "dq", "dk", "dv"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
        for label, g, w in zip(names, got, want):
            err = (g.float() - w).abs().max() / w.abs().max().clamp_min(1e-6)
            assert err <= 1e-4, f"kv_heads {kv_heads} {case} {label}: relative error {err:.2e}"


def test_cpu_compiled_tabulated_lookup_grows_with_the_distance():
    """Sandwich's table (a lookup tabulated to the largest distance of the call) in the compiled
    kernel: offset 0 fits the first 256-entry table, offset 1000 needs a 2048-entry one."""
    scheme = make_scheme("sandwich")
    backend = resolve_backend("flex", scheme, CPU, F32, False)
    assert not backend.eager_on_cpu
    for case in ((3, 9, 0, None), (3, 9, 1000, 4)):
        assert_inference_matches(backend, scheme, case)
