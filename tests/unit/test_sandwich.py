"""pos-emb sandwich against the paper's formula written out here (python floats, one cosine at a
time), at short distances and at 64k positions, its TP head split, its growing table, and the
sandwich-dim key."""
import math

import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme


def paper_bias(d: int, head: int, num_heads: int, dim: int) -> float:
    """Chi et al. 2212.10356: p_m . p_n = sum_{i=1}^{d'/2} cos((m-n) / 10000^(2i/d')), minus d'/2,
    divided by head h's compression 8h/H (h = 1..H)."""
    inner = sum(math.cos(d / 10000 ** (2 * i / dim)) for i in range(1, dim // 2 + 1))
    return (inner - dim / 2) / (8 * head / num_heads)


def spec(heads=4, head_dim=8, tp_rank=0, tp_size=1, **options):
    return PositionalSpec(num_heads=heads, head_dim=head_dim, hidden_size=heads * head_dim,
                          max_position_embeddings=32, tp_rank=tp_rank, tp_size=tp_size, options=options)


def check_against_paper(scheme, q_pos, k_pos, num_heads, dim, first_head=1, atol=1e-5):
    bias = scheme.score_bias(q_pos, k_pos)  # (H_local, Lq, Lk)
    assert bias.dtype == torch.float32 and torch.isfinite(bias).all()
    for h in range(bias.shape[0]):
        for i, qp in enumerate(q_pos.tolist()):
            for j, kp in enumerate(k_pos.tolist()):
                want = paper_bias(max(qp - kp, 0), first_head + h, num_heads, dim)
                assert abs(bias[h, i, j].item() - want) <= atol * max(1.0, abs(want)), (h, qp, kp)


@pytest.mark.parametrize("dim", [None, 16, 64])
def test_short_distances_match_the_paper(dim):
    options = {} if dim is None else {"sandwich_dim": dim}
    scheme = build_scheme("sandwich", spec(**options))
    k_pos = torch.arange(12) + 3
    check_against_paper(scheme, k_pos[4:], k_pos, num_heads=4, dim=dim or 8)  # default d' = head_dim
    assert scheme.score_bias(k_pos[:1], k_pos[:1]).abs().max() == 0  # 0 at distance 0
    assert list(scheme.parameters()) == [] and scheme.stats() == {}  # nothing is learned


def test_64k_positions_are_finite_and_match_the_paper():
    scheme = build_scheme("sandwich", spec(heads=2, sandwich_dim=128))
    q_pos = torch.tensor([65535, 40000])
    k_pos = torch.cat([torch.arange(0, 65536, 4099), torch.tensor([39999, 65534, 65535])])
    # float32 cosines of 64k-token arguments carry ~1e-6 relative error per term; 64 terms
    check_against_paper(scheme, q_pos, k_pos, num_heads=2, dim=128, atol=2e-5)
    table = scheme.fused_kernel().covering(65535, torch.device("cpu")).lookup_values()
    assert table.shape == (2, 65536) and torch.isfinite(table).all()  # 2^16 entries: 512 KiB


def test_tensor_parallel_ranks_hold_their_heads():
    q_pos = k_pos = torch.arange(20)
    full = build_scheme("sandwich", spec(heads=4)).score_bias(q_pos, k_pos)
    for rank in range(2):
        part = build_scheme("sandwich", spec(heads=4, tp_rank=rank, tp_size=2)).score_bias(q_pos, k_pos)
        torch.testing.assert_close(part, full[2 * rank:2 * rank + 2], rtol=0, atol=0)


def test_the_table_grows_to_the_distance_asked_and_keeps_its_values():
    scheme = build_scheme("sandwich", spec())
    kernel = scheme.fused_kernel()
    short = kernel.covering(10, torch.device("cpu")).lookup_values()
    long = kernel.covering(5000, torch.device("cpu")).lookup_values()
    assert short.shape[1] == 256 and long.shape[1] == 8192  # powers of two: few Triton recompiles
    torch.testing.assert_close(long[:, :256], short, rtol=0, atol=0)
    # a dense evaluation beyond the table extends it rather than clamping at its last entry
    far = kernel.bias_at(torch.tensor([[9000.0]]))
    assert abs(far[3, 0, 0].item() - paper_bias(9000, 4, 4, 8)) < 1e-5


@pytest.mark.parametrize("value,message", [(7, "must be even"), (0, ">= 2"), (1.5, "expected int")])
def test_bad_sandwich_dim_names_the_key(tmp_path, value, message):
    path = tmp_path / "bad.yml"
    path.write_text(f"num-layers: 2\nhidden-size: 32\nnum-attention-heads: 4\nseq-length: 64\ntrain-iters: 3\n"
                    f"pos-emb: sandwich\nsandwich-dim: {value}\n")
    with pytest.raises(ConfigError) as e:
        load_config([str(path)])
    assert "sandwich-dim" in str(e.value) or "sandwich_dim" in str(e.value)
    assert message in str(e.value)
