"""pos-emb rpe (T5's buckets): the rule between rpe-num-buckets and rpe-max-distance, held equal to
where the bucketing itself breaks. Before, a config on the wrong side of it built a model that
failed in its first forward with a ZeroDivisionError or an AssertionError, a traceback each."""
import pytest
import torch

from megatron.config import ConfigError, load_config
from megatron.positional.base import PositionalSpec
from megatron.positional.registry import build_scheme
from megatron.positional.rpe import bucket_problems, rpe_bucket


def buckets_work(num_buckets: int, max_distance: int) -> bool:
    """Every distance gets a bucket in range and every distance >= max_distance the last one
    (what the scheme's table of 0..max_distance relies on)."""
    try:
        near = rpe_bucket(torch.arange(max_distance + 1), num_buckets, max_distance)
        far = rpe_bucket(torch.tensor([max_distance, 4 * max_distance, 1 << 40]), num_buckets, max_distance)
    except ZeroDivisionError:
        return False
    return bool(((near >= 0) & (near < num_buckets)).all()) and bool((far == num_buckets - 1).all())


def test_the_rule_is_where_the_bucketing_breaks():
    pairs = [(b, d) for b in [*range(1, 70), 128, 1024] for d in [*range(1, 200), 4096, 100_000]]
    wrong = [(b, d) for b, d in pairs if (not bucket_problems(b, d)) != buckets_work(b, d)]
    assert wrong == []
    assert bucket_problems(32, 128) == []  # the default, NeoX's


@pytest.mark.parametrize("buckets,distance,key", [(1, 128, "rpe-num-buckets"), (32, 16, "rpe-max-distance"),
                                                  (64, 32, "rpe-max-distance")])
def test_a_config_outside_the_rule_is_refused_by_name(tmp_path, buckets, distance, key):
    path = tmp_path / "bad.yml"
    path.write_text("num-layers: 2\nhidden-size: 32\nnum-attention-heads: 4\nseq-length: 64\ntrain-iters: 3\n"
                    f"pos-emb: rpe\nrpe-num-buckets: {buckets}\nrpe-max-distance: {distance}\n")
    with pytest.raises(ConfigError) as e:
        load_config([str(path)])
    assert key.replace("-", "_") in str(e.value) or key in str(e.value)
    assert "must be" in str(e.value) and "Traceback" not in str(e.value)


def test_a_scheme_built_outside_the_config_refuses_it_too():
    spec = PositionalSpec(num_heads=2, head_dim=8, hidden_size=16, max_position_embeddings=32,
                          options={"rpe_num_buckets": 32, "rpe_max_distance": 16})
    with pytest.raises(ValueError, match="rpe-max-distance must be > rpe-num-buckets // 2"):
        build_scheme("rpe", spec)
