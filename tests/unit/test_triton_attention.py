"""The Triton fused attention kernel against the reference backend: forward and backward including
the positional parameters' gradients, across block boundaries, windows, kv-cache rows, head dims
64/128 and bf16/fp16; bitwise-reproducible parameter gradients; clear refusals.

Without CUDA the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1),
so shapes stay small; the same tests run compiled on a GPU, plus larger ones marked for CUDA."""
import importlib.util

import pytest
import torch

from megatron.attention import resolve_backend
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme

pytestmark = [pytest.mark.gpu,  # compiled on a GPU (make test-gpu), Triton's interpreter on CPU
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")]
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
FUSED = ["kerple_log", "kerple_log_3para", "kerple_power_ap_", "kerple_power_ap_ap", "alibi", "rpe", "sandwich"]


def scheme_for(name, heads, head_dim, seed=0):
    torch.manual_seed(seed)
    spec = PositionalSpec(num_heads=heads, head_dim=head_dim, hidden_size=heads * head_dim,
                          max_position_embeddings=64, options={"rpe_num_buckets": 8, "rpe_max_distance": 20})
    scheme = build_scheme(name, spec).to(DEVICE)
    with torch.no_grad():  # trained-looking parameters, not only the init draw
        for p in scheme.parameters():
            p.mul_(1.3)
    return scheme


def attend(backend_name, scheme, q, k, v, q_pos, k_pos, window, grad_out, row_starts=None):
    backend = resolve_backend(backend_name, scheme, DEVICE, q.dtype, True, padded=row_starts is not None)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = backend.forward(q, k, v, scheme, q_pos, k_pos, window=window, softmax_in_fp32=True, row_starts=row_starts)
    params = [p for p in scheme.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out.float() * grad_out).sum(), [q, k, v] + params)
    return out.detach(), grads


def inputs(B, H, lq, lk, D, dtype, offset=0, seed=1):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (lq, lk, lk))
    grad_out = torch.randn(B, H, lq, D, generator=g)
    k_pos = torch.arange(lk) + offset
    # grad_out is rounded to dtype too: the kernel receives dO in dtype, and the fp32 truth must
    # see the same dO or its rounding (~2^-9) shows up as kernel error (1.0e-2 in bias_p on an H100)
    grad_out = grad_out.to(dtype).float()
    return [x.to(DEVICE, dtype) for x in (q, k, v)] + [grad_out.to(DEVICE), k_pos[lk - lq:].to(DEVICE), k_pos.to(DEVICE)]


def relative_errors(results, truth):
    return [(got.float() - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
            for got, want in zip((results[0], *results[1]), (truth[0], *truth[1]))]


def compare(name, B, H, lq, lk, D, dtype, window=None, offset=0, tol=1e-4, seed=1, row_starts=None, kv_heads=None):
    """Relative max error of out, dq, dk, dv and every parameter gradient against the reference
    backend run in fp32 on the same (already rounded) inputs. `row_starts`: padded rows.
    `kv_heads`: grouped-query attention, k and v the first kv_heads heads (views: strided heads)."""
    scheme = scheme_for(name, H, D)
    q, k, v, grad_out, q_pos, k_pos = inputs(B, H, lq, lk, D, dtype, offset, seed)
    if kv_heads is not None:
        k, v = k[:, :kv_heads], v[:, :kv_heads]
    starts = None if row_starts is None else torch.tensor(row_starts, device=DEVICE) + offset
    truth = attend("reference", scheme, q.float(), k.float(), v.float(), q_pos, k_pos, window, grad_out, starts)
    errors = relative_errors(attend("triton", scheme, q, k, v, q_pos, k_pos, window, grad_out, starts), truth)
    names = ["out", "dq", "dk", "dv"] + [n for n, p in scheme.named_parameters() if p.requires_grad]
    for n, err in zip(names, errors):
        assert err <= tol, f"{name} {n}: relative error {err:.2e} > {tol:.0e}"


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("lq,lk,window,offset", [(40, 40, None, 0), (37, 37, 5, 3), (6, 40, None, 1000), (6, 40, 9, 7)],
                         ids=["multiblock", "window", "kvcache-rows", "kvcache-window"])
def test_matches_reference_fp32(name, lq, lk, window, offset):
    compare(name, 2, 2, lq, lk, 8, torch.float32, window=window, offset=offset)


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("lq,lk,window,offset", [(40, 40, None, 0), (37, 37, 5, 3), (6, 40, None, 1000)],
                         ids=["multiblock", "window", "kvcache-rows"])
def test_padded_rows_match_reference(name, lq, lk, window, offset):
    """Left-padded rows (megatron/attention/mask.py): padding keys hidden in the forward and in both
    backward kernels, parameter gradients included; padding queries attend to themselves."""
    compare(name, 3, 2, lq, lk, 8, torch.float32, window=window, offset=offset, row_starts=[0, 5, 17])


def test_padded_rows_bf16():
    compare("kerple_log", 3, 2, 37, 37, 16, torch.bfloat16, tol=1e-2, row_starts=[0, 5, 17])


# Grouped-query attention: the dk/dv kernel walks each group's query heads in one program and
# writes each head's parameter partials (attention_bwd.py). Every kind of parameter gradient (log
# bias, learned exponent and weight, T5 table per bucket), over several key and query blocks.
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv2", "kv1"])
@pytest.mark.parametrize("name", ["kerple_log", "kerple_power_ap_ap", "rpe"])
def test_grouped_query_matches_reference(name, kv_heads):
    compare(name, 1, 4, 40, 40, 8, torch.float32, kv_heads=kv_heads)


def test_grouped_query_window_padding_table_path(monkeypatch):
    """Grouped heads with a window, kv-cache rows, padded rows and the table path's derivative
    tables (read per query head) at once."""
    monkeypatch.setenv("KERPLE_TRITON_BIAS", "table")
    compare("kerple_log", 3, 4, 6, 40, 8, torch.float32, window=9, offset=7, row_starts=[0, 5, 17], kv_heads=2)


def test_grouped_query_bf16():
    compare("kerple_log", 1, 4, 37, 37, 16, torch.bfloat16, window=5, tol=1e-2, kv_heads=1)


def test_zero_row_starts_equal_no_padding():
    scheme = scheme_for("kerple_log", 2, 8)
    q, k, v, grad_out, q_pos, k_pos = inputs(2, 2, 33, 33, 8, torch.float32)
    plain = attend("triton", scheme, q, k, v, q_pos, k_pos, None, grad_out)
    zeros = attend("triton", scheme, q, k, v, q_pos, k_pos, None, grad_out, torch.zeros(2, dtype=torch.long))
    assert all(torch.equal(a, b) for a, b in zip((plain[0], *plain[1]), (zeros[0], *zeros[1])))


# Schemes whose bias the kernel can evaluate per score (inline) or load from a per-call table over
# distance (table path, megatron/attention/kernels/bias_table.py): both paths must match the reference.
TABULATED = ["kerple_log", "kerple_log_3para", "kerple_power_ap_", "kerple_power_ap_ap", "alibi"]


@pytest.mark.parametrize("path", ["table", "inline"])
@pytest.mark.parametrize("name", TABULATED)
@pytest.mark.parametrize("lq,lk,window,offset", [(40, 40, None, 0), (37, 37, 5, 3), (6, 40, 9, 7)],
                         ids=["multiblock", "window", "kvcache-window"])
def test_both_bias_paths_match_reference(monkeypatch, path, name, lq, lk, window, offset):
    monkeypatch.setenv("KERPLE_TRITON_BIAS", path)
    compare(name, 2, 2, lq, lk, 8, torch.float32, window=window, offset=offset)


@pytest.mark.parametrize("name", ["kerple_log", "alibi"])
def test_three_key_bands_window(name):
    """80 x 80 keys, window 40, 16-wide blocks: the last query block has a masked band at the
    window's edge, an unmasked band in the middle and the diagonal band (attention_fwd.py)."""
    compare(name, 1, 2, 80, 80, 8, torch.float32, window=40)


def test_forward_bands_random_shapes():
    """The forward's band split (which key blocks skip the mask) against the reference over random
    lengths, windows and kv-cache offsets, forward only (cheap): a tile wrongly taken as fully
    allowed lets masked keys into the softmax."""
    from megatron.attention.kernels.attention import triton_attention

    g = torch.Generator().manual_seed(0)
    scheme = scheme_for("kerple_log", 2, 8)
    for _ in range(12):
        lk = int(torch.randint(1, 90, (1,), generator=g))
        lq = int(torch.randint(1, lk + 1, (1,), generator=g))
        window = None if torch.rand(1, generator=g) < 0.3 else int(torch.randint(1, 60, (1,), generator=g))
        offset = int(torch.randint(0, 50, (1,), generator=g))
        q, k, v, _, q_pos, k_pos = inputs(1, 2, lq, lk, 8, torch.float32, offset, seed=lq * 100 + lk)
        with torch.no_grad():
            got = triton_attention(q, k, v, scheme.fused_kernel(), int(q_pos[0]), int(k_pos[0]), window)
            want = resolve_backend("reference", scheme, DEVICE, torch.float32, False).forward(
                q, k, v, scheme, q_pos, k_pos, window=window, softmax_in_fp32=True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"lq={lq} lk={lk} window={window}")


def test_backward_bands_random_shapes():
    """Both backward kernels' band splits (kernels/bands.py), gradients included, over random
    lengths, windows and kv-cache offsets (lengths not multiples of the 16-wide blocks)."""
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        lk = int(torch.randint(17, 75, (1,), generator=g))
        lq = int(torch.randint(1, lk + 1, (1,), generator=g))
        window = None if torch.rand(1, generator=g) < 0.3 else int(torch.randint(1, 50, (1,), generator=g))
        offset = int(torch.randint(0, 30, (1,), generator=g))
        compare("kerple_log", 1, 2, lq, lk, 8, torch.float32, window=window, offset=offset, seed=lq + lk)


@pytest.mark.parametrize("lq,lk,offset,blocks", [(192, 192, 0, None), (40, 200, 1000, "16,16,16,32")])
def test_far_tiles_match_reference(monkeypatch, lq, lk, offset, blocks):
    """KERPLE-log's far tiles (kernels/distance_bias.py FAR_U: the series in all three kernels) next
    to near and masked ones: with 16 x 16 blocks a tile is far from a centre distance of
    8 * 15 - 1 / r2 on, so these lengths hold both kinds; kv-cache rows and non-square backward tiles."""
    if blocks:
        monkeypatch.setenv("KERPLE_TRITON_BLOCKS", blocks)
    r2 = scheme_for("kerple_log", 2, 8).fused_kernel().r2.detach()
    assert (8 * 15 - 1 / r2 < lk - 48).all()  # far tiles (centre distance up to ~lk - 16) for both heads
    compare("kerple_log", 1, 2, lq, lk, 8, torch.float32, offset=offset)


@pytest.mark.parametrize("name", ["kerple_log", "rpe"])
def test_backward_non_square_tiles(monkeypatch, name):
    """A bwd config with block_m != block_n: dk/dv walk 16-query blocks over 32 keys (key-major
    tiles), dq runs the mirror tile, 32 queries over 16-key blocks (kernels/tuning.py)."""
    monkeypatch.setenv("KERPLE_TRITON_BLOCKS", "16,16,16,32")
    compare(name, 1, 2, 45, 45, 8, torch.float32, window=20, offset=3)


@pytest.mark.parametrize("path", ["table", "inline"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_both_bias_paths_half_precision(monkeypatch, path, dtype):
    monkeypatch.setenv("KERPLE_TRITON_BIAS", path)
    compare("kerple_log_3para", 1, 2, 33, 33, 16, dtype, tol=1e-2)


@pytest.mark.parametrize("path, name, table_rows", [
    ("table", "kerple_log", 2), ("auto", "kerple_log", 0), ("auto", "kerple_power_ap_", 0),
    ("auto", "kerple_log_3para", 0), ("table", "kerple_power_ap_", 2), ("table", "kerple_log_3para", 2),
    ("inline", "kerple_log", 0), ("auto", "alibi", 0), ("table", "alibi", 2), ("table", "rpe", 2)])
def test_bias_path_is_the_one_asked_for(monkeypatch, path, name, table_rows):
    """What the kernel was given: a (H, distances) table on the table path (rpe: its own T5 lookup,
    whatever the option), nothing on the inline path; auto is inline for every bias
    (kernels/bias_table.py says why)."""
    from megatron.attention.kernels.attention import triton_attention

    monkeypatch.setenv("KERPLE_TRITON_BIAS", path)
    scheme = scheme_for(name, 2, 8)
    q, k, v, _, q_pos, k_pos = inputs(1, 2, 6, 40, 8, torch.float32, offset=7)
    out = triton_attention(q.requires_grad_(), k, v, scheme.fused_kernel(), int(q_pos[0]), int(k_pos[0]))
    lut = out.grad_fn.saved_tensors[10]
    assert lut.shape[0] == table_rows
    if table_rows and name != "rpe":
        assert lut.shape[1] == 40  # distances 0..39: the last query to the first key, no more (O(L))
        want = scheme.fused_kernel().bias_at(torch.arange(40.0, device=DEVICE)[None])[:, 0]
        assert torch.equal(lut, want.detach())


def test_bad_bias_path_is_refused(monkeypatch):
    from megatron.attention.kernels.attention import triton_attention

    monkeypatch.setenv("KERPLE_TRITON_BIAS", "tabel")
    q, k, v, _, q_pos, k_pos = inputs(1, 2, 4, 4, 8, torch.float32)
    with pytest.raises(ValueError, match="KERPLE_TRITON_BIAS='tabel'.*auto, table, inline"):
        triton_attention(q, k, v, scheme_for("kerple_log", 2, 8).fused_kernel(), 0, 0)


@pytest.mark.parametrize("path", ["table", "inline"])
def test_parameter_gradients_are_bitwise_reproducible_on_both_paths(monkeypatch, path):
    monkeypatch.setenv("KERPLE_TRITON_BIAS", path)
    scheme = scheme_for("kerple_power_ap_", 2, 16)
    q, k, v, grad_out, q_pos, k_pos = inputs(2, 2, 50, 50, 16, torch.float32)
    runs = [attend("triton", scheme, q, k, v, q_pos, k_pos, None, grad_out)[1] for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_dims(head_dim):
    compare("kerple_log", 1, 2, 33, 33, head_dim, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["kerple_log", "kerple_power_ap_ap", "rpe", "sandwich"])
@pytest.mark.parametrize("seed", [1, 2])
def test_half_precision(name, dtype, seed):
    compare(name, 1, 2, 33, 33, 16, dtype, tol=1e-2, seed=seed)


def test_parameter_gradients_are_bitwise_reproducible():
    scheme = scheme_for("kerple_log_3para", 2, 16)
    q, k, v, grad_out, q_pos, k_pos = inputs(2, 2, 50, 50, 16, torch.float32)
    runs = [attend("triton", scheme, q, k, v, q_pos, k_pos, None, grad_out)[1] for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_scheme_parameters_train_through_the_model(tiny_config):
    """Whole-model check: loss and every gradient equal the SDPA backend's."""
    from megatron.model.gpt import GPTModel

    results = []
    for backend in ("triton", "sdpa"):
        cfg = tiny_config(**{"attention-backend": backend, "seq-length": 24})
        torch.manual_seed(0)
        model = GPTModel(cfg.model, 128).to(DEVICE)
        tokens = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0)).to(DEVICE)
        loss = model(tokens, labels=tokens)
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_t, grads_t), (loss_s, grads_s) = results
    assert abs(loss_t - loss_s) < 1e-5
    for n, g in grads_s.items():
        torch.testing.assert_close(grads_t[n], g, rtol=1e-4, atol=1e-6, msg=n)
    assert grads_t["position.bias_p"].abs().sum() > 0


@pytest.mark.parametrize("name", ["kerple_log", "rpe"])
def test_layers_reduce_their_parameter_gradients_once(tiny_config, monkeypatch, name):
    """The layers of a forward share one kernel and ONE reduction of its parameter gradients
    (kernels/attention.py ForwardGradients), through activation checkpointing: the loss bit for
    bit and every gradient, up to rounding, as when each call builds its kernel and reduces its
    own; a second backward through the same graph adds the same gradients again."""
    import megatron.attention.triton as triton_backend
    from megatron.model.gpt import GPTModel

    cfg = tiny_config(pos_emb=name, num_layers=3, attention_backend="triton", seq_length=16).model
    tokens = torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    results = []
    for shared in (True, False):
        if not shared:  # each call builds its own kernel (as under ZeRO-3) and reduces its own partials
            monkeypatch.setattr(triton_backend, "partitioned", lambda scheme: True)
        torch.manual_seed(0)
        model = GPTModel(cfg, 128, checkpoint_activations=True).to(DEVICE)
        loss = model(tokens[:, :-1], labels=tokens[:, 1:])
        loss.backward(retain_graph=True)
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        loss.backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, 2 * grads[n], rtol=1e-6, atol=0, msg=n)
        results.append((loss.detach(), grads))
    (loss_s, grads_s), (loss_c, grads_c) = results
    assert torch.equal(loss_s, loss_c)
    positional = [n for n in grads_s if n.startswith("position.")]
    assert positional and all(grads_s[n].abs().sum() > 0 for n in positional)
    for n, g in grads_c.items():
        torch.testing.assert_close(grads_s[n], g, rtol=1e-5, atol=1e-8, msg=n)


def test_non_consecutive_positions_are_refused():
    scheme = scheme_for("kerple_log", 2, 8)
    q, k, v, _, q_pos, k_pos = inputs(1, 2, 4, 4, 8, torch.float32)
    backend = resolve_backend("triton", scheme, DEVICE, torch.float32, False)
    with pytest.raises(ValueError, match="consecutive key positions.*sdpa or reference"):
        backend.forward(q, k, v, scheme, q_pos, k_pos * 2)


def test_distances_past_the_kernels_range_are_refused():
    """Distances are formed as floats bit by bit (kernels/fma_log2.small_int_to_float): < 2^23."""
    scheme = scheme_for("kerple_log", 2, 8)
    q, k, v, _, q_pos, k_pos = inputs(1, 2, 4, 4, 8, torch.float32)
    backend = resolve_backend("triton", scheme, DEVICE, torch.float32, False)
    with pytest.raises(ValueError, match="distances below 8388608.*got 8388608.*sdpa or reference"):
        backend.forward(q, k, v, scheme, q_pos + 2**23 - 3, k_pos)


@pytest.mark.parametrize("starts", [[0, 5], [[0], [5], [17]], [0.0, 5.0, 17.0]], ids=["short", "2d", "float"])
def test_malformed_row_starts_are_refused(starts):
    """The kernels read STARTS[b] for every batch row: refused before launch, never read past the end."""
    scheme = scheme_for("kerple_log", 2, 8)
    q, k, v, _, q_pos, k_pos = inputs(3, 2, 4, 4, 8, torch.float32)
    backend = resolve_backend("triton", scheme, DEVICE, torch.float32, False, padded=True)
    with pytest.raises(ValueError, match=r"row_starts must be a \(3,\) integer tensor"):
        backend.forward(q, k, v, scheme, q_pos, k_pos, row_starts=torch.tensor(starts, device=DEVICE))


def test_dropout_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="no attention dropout.*attention-dropout 0"):
        resolve_backend("triton", scheme_for("kerple_log", 2, 8), DEVICE, torch.float32, True, dropout=True)


def test_bad_block_override(monkeypatch):
    from megatron.attention.kernels.tuning import manual_blocks

    monkeypatch.setenv("KERPLE_TRITON_BLOCKS", "64,64")
    with pytest.raises(ValueError, match="KERPLE_TRITON_BLOCKS='64,64'.*four integers"):
        manual_blocks()


def test_auto_never_picks_the_interpreter_on_cpu():
    assert resolve_backend("auto", scheme_for("kerple_log", 2, 8), torch.device("cpu"), torch.float32, True).name == "sdpa"


@pytest.mark.parametrize("name", ["rpe", "kerple_log"])
def test_half_precision_output_kept_for_the_backward_is_p_at_v(name):
    """The backward's delta = rowsum(dO * O) is exact only if the saved fp32 O is P @ V for the P
    the backward recomputes. With P rounded to bf16 before P @ V it was off by ~1e-3, which made
    the T5 table's gradient 5.8% wrong on an H100 (bf16, 300 x 2048 keys, window 512; 5.5% in the
    interpreter) because the gradient of a far bucket sums whole rows of dS, which cancel."""
    from megatron.attention.kernels.attention import triton_attention

    scheme = scheme_for(name, 2, 16)
    q, k, v, _, q_pos, k_pos = inputs(1, 2, 40, 200, 16, torch.bfloat16, offset=5)
    out = triton_attention(q, k, v, scheme.fused_kernel(), int(q_pos[0]), int(k_pos[0]), 150)
    saved_out = out.grad_fn.saved_tensors[3]  # the fp32 O the backward reads
    want = attend("reference", scheme, q.float(), k.float(), v.float(), q_pos, k_pos, 150,
                  torch.zeros(1, 2, 40, 16, device=DEVICE))[0]
    err = ((saved_out - want).abs().max() / want.abs().max()).item()
    assert err < 1e-4, f"{name}: saved O is P @ V only to {err:.1e}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: compiled Triton at real sizes")
@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
def test_gpu_real_sizes(name, dtype, tol):
    compare(name, 2, 4, 1024, 1024, 64, dtype, tol=tol)
    compare(name, 1, 4, 300, 2048, 128, dtype, window=512, offset=5, tol=tol)


def test_bad_window_is_refused():
    scheme = scheme_for("kerple_log", 2, 8)
    q, k, v, _, q_pos, k_pos = inputs(1, 2, 4, 4, 8, torch.float32)
    backend = resolve_backend("triton", scheme, DEVICE, torch.float32, False)
    with pytest.raises(ValueError, match="attention window must be an integer >= 1"):
        backend.forward(q, k, v, scheme, q_pos, k_pos, window=0)


@pytest.mark.parametrize("name", ["kerple_log", "alibi", "none"])
def test_large_scores_rescale_lazily_and_exactly(name):
    """The forward rescales its accumulator only when a row's max grows by more than
    RESCALE_SLACK (attention_fwd.py). Scores of std ~30 make the max jump by more than that on
    some tiles and not on others, in both orders of the walk: out, LSE-based gradients and the
    parameter gradients still match the fp32 reference."""
    scheme = scheme_for(name, 2, 8)
    q, k, v, grad_out, q_pos, k_pos = inputs(2, 2, 70, 70, 8, torch.float32, seed=3)
    q, k = q * 6.0, k * 6.0
    truth = attend("reference", scheme, q, k, v, q_pos, k_pos, None, grad_out)
    errors = relative_errors(attend("triton", scheme, q, k, v, q_pos, k_pos, None, grad_out), truth)
    assert max(errors) <= 1e-4, errors
