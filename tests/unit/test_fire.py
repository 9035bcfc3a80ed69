"""FIRE (Li et al. 2023, arXiv 2310.04418) against its formula written here from the paper.

The paper: b(i, j) = f_theta(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), f_theta =
Linear(1, 32) -> ReLU -> Linear(32, H), and its listing's parametrisation: |c|, L =
|L_multiplier| * init_L, eps added to the denominator. Written in float64 numpy, not by calling
the scheme's own methods."""
import numpy as np
import pytest
import torch

from megatron.attention import resolve_backend
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme

H = 4


def fire(options=None, tp_rank=0, tp_size=1, seed=0):
    torch.manual_seed(seed)
    spec = PositionalSpec(num_heads=H, head_dim=8, hidden_size=32, max_position_embeddings=64,
                          tp_rank=tp_rank, tp_size=tp_size, options=options or {})
    return build_scheme("fire", spec)


def paper_bias(scheme, q_pos, k_pos, init_L):
    """[H, Lq, Lk] float64 for j <= i, straight from the paper's definition."""
    p = {n: t.detach().double().numpy() for n, t in scheme.named_parameters()}
    c, L = abs(p["c"].item()), abs(p["threshold_multiplier"].item()) * init_L
    i = np.asarray(q_pos, dtype=np.float64)[:, None]
    j = np.asarray(k_pos, dtype=np.float64)[None, :]
    with np.errstate(invalid="ignore"):  # j > i (masked) gives log of a negative: not compared
        x = np.log(c * (i - j) + 1) / (np.log(c * np.maximum(L, i) + 1) + 1e-6)  # [Lq, Lk]
    hidden = np.maximum(x[..., None] * p["hidden_weight"][:, 0] + p["hidden_bias"], 0.0)  # [Lq, Lk, W]
    return np.einsum("qkw,hw->hqk", hidden, p["out_weight"]) + p["out_bias"][:, None, None]


def lower(bias, q_pos, k_pos):
    """The entries with j <= i (the causal ones), flattened per head."""
    keep = np.asarray(q_pos)[:, None] >= np.asarray(k_pos)[None, :]
    return (bias.detach().double().numpy() if torch.is_tensor(bias) else bias)[:, keep]


def test_paper_init_and_shapes():
    s = fire()
    assert s.out_weight.shape == (H, 32) and s.hidden_weight.shape == (32, 1)
    assert s.c.item() == pytest.approx(0.1) and s.threshold_multiplier.item() == 1.0
    assert s.init_threshold == 512.0
    s = fire({"fire_mlp_width": 8, "fire_init_c": 0.5, "fire_init_threshold": 4.0})
    assert s.out_weight.shape == (H, 8) and s.c.item() == pytest.approx(0.5) and s.init_threshold == 4.0


@pytest.mark.parametrize("init_L", [512.0, 3.0])  # 3: queries past L take psi(i) as the normaliser
def test_short_length_matches_paper(init_L):
    s = fire({"fire_init_threshold": init_L, "fire_init_c": 0.7})
    with torch.no_grad():  # trained-looking parameters, c and the multiplier off their init
        s.c.mul_(-1.5)
        s.threshold_multiplier.fill_(-1.2)
    pos = torch.arange(16)
    got = s.score_bias(pos, pos)
    assert got.shape == (H, 16, 16) and got.dtype == torch.float32
    np.testing.assert_allclose(lower(got, pos, pos), lower(paper_bias(s, pos, pos, init_L), pos, pos),
                               rtol=1e-5, atol=1e-6)
    assert torch.isfinite(got).all()  # the masked upper triangle too


def test_depends_on_the_query_position_not_the_distance_alone():
    s = fire({"fire_init_threshold": 2.0})
    b = s.score_bias(torch.tensor([10, 20]), torch.tensor([5, 15]))  # both at distance 5
    assert not torch.allclose(b[:, 0, 0], b[:, 1, 1])


def test_64k_positions_finite_and_match_paper():
    s = fire()
    q_pos = torch.tensor([0, 511, 512, 40_000, 65_535])
    k_pos = torch.arange(65_536)
    got = s.score_bias(q_pos, k_pos)
    assert torch.isfinite(got).all()
    x = s.normalized_distance(q_pos, k_pos).detach()
    assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0  # progressive interpolation: [0, 1]
    np.testing.assert_allclose(lower(got, q_pos, k_pos), lower(paper_bias(s, q_pos, k_pos, 512.0), q_pos, k_pos),
                               rtol=1e-5, atol=1e-5)
    got.sum().backward()  # and the gradients at 64k
    assert all(torch.isfinite(p.grad).all() for p in s.parameters())


def test_blocked_evaluation_equals_one_block(monkeypatch):
    import megatron.positional.fire as fire_module

    s = fire()
    pos = torch.arange(40)
    whole = s.score_bias(pos, pos)
    monkeypatch.setattr(fire_module, "HIDDEN_BLOCK_ELEMENTS", 3 * 40 * 32)  # 3 query rows per block
    torch.testing.assert_close(s.score_bias(pos, pos), whole, rtol=0, atol=0)


def test_tp_rank_holds_its_heads_rows():
    full = fire(seed=3)
    pos = torch.arange(12)
    whole = full.score_bias(pos, pos)
    for rank in range(2):
        part = fire(tp_rank=rank, tp_size=2, seed=3)
        rows = slice(rank * H // 2, (rank + 1) * H // 2)
        assert part.out_weight.shape == (H // 2, 32)
        torch.testing.assert_close(part.out_weight, full.out_weight[rows])
        torch.testing.assert_close(part.hidden_weight, full.hidden_weight)  # replicated
        torch.testing.assert_close(part.score_bias(pos, pos), whole[rows])


def test_tp_shard_dims():
    from megatron.parallel.layout import scheme_dims

    assert scheme_dims(fire()) == {"hidden_weight": None, "hidden_bias": None, "out_weight": 0,
                                             "out_bias": 0, "c": None, "threshold_multiplier": None}


def test_fused_backends_refuse_and_auto_takes_sdpa():
    s = fire()
    cpu = torch.device("cpu")
    assert resolve_backend("auto", s, cpu, torch.float32, True).name == "sdpa"
    assert resolve_backend("auto", s, cpu, torch.float32, False, tokens=8192).name == "sdpa"
    for name in ("triton", "flex", "flash"):
        with pytest.raises(ValueError, match="fire"):
            resolve_backend(name, s, cpu, torch.float32, False)


def test_stats_keys_and_values():
    s = fire({"fire_init_threshold": 100.0})
    st = s.stats()
    assert st["fire_c"] == pytest.approx(0.1) and st["fire_threshold"] == pytest.approx(100.0)
    norms = s.out_weight.detach().norm(dim=1)
    assert st["fire_head_norm_max"] == pytest.approx(norms.max().item())
    assert set(st) == {"fire_c", "fire_threshold", *(f"fire_head_norm_{k}" for k in ("mean", "std", "max", "min"))}


@pytest.mark.parametrize("key,value", [("fire-mlp-width", 0), ("fire-init-c", 0.0), ("fire-init-threshold", -1.0)])
def test_bad_config_values_name_the_key(tmp_path, key, value):
    from megatron.config import load_config
    from megatron.errors import UserError
    from tests.conftest import write_yaml

    path = write_yaml(tmp_path / "c.yml", {"num-layers": 1, "hidden-size": 8, "num-attention-heads": 2,
                                            "seq-length": 8, "pos-emb": "fire", key: value})
    with pytest.raises(UserError, match=f"{key} = {value}.*must be >"):
        load_config([path])


def test_backend_agreement_tests_cover_fire():
    """Reference vs SDPA, forward and backward with FIRE's parameter gradients in fp32 and bf16,
    is tests/unit/test_attention_backends.py (parametrized over the registry): keep FIRE in it."""
    from tests.unit.test_attention_backends import accepted_pairs

    assert [b for b, s in accepted_pairs() if s == "fire"] == ["sdpa"]
