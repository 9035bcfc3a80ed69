"""Each scheme's description (DistanceKernel) is where its score hooks come from, so a fused kernel
that reproduces DistanceKernel's closed forms reproduces the scheme. (The closed forms themselves
are checked against hand-written formulas in test_positional_closed_forms.py.)"""
import pytest
import torch

from megatron.positional.base import PositionalSpec
from megatron.positional.distance import causal_distance
from megatron.positional.registry import build_scheme, scheme_class, scheme_names

SPEC = PositionalSpec(num_heads=4, head_dim=8, hidden_size=32, max_position_embeddings=64,
                      options={"rpe_num_buckets": 8, "rpe_max_distance": 20})


# Query-dependent schemes (FIRE) have no distance-only description by design (test_fire.py).
DISTANCE_ONLY = [n for n in scheme_names() if scheme_class(n).shift_invariant]


@pytest.mark.parametrize("name", DISTANCE_ONLY)
def test_distance_kernel_matches_score_hooks(name):
    torch.manual_seed(0)
    scheme = build_scheme(name, SPEC)
    with torch.no_grad():
        for p in scheme.parameters():
            p.mul_(1.3)
    spec = scheme.fused_kernel()
    assert spec is not None, f"{name} has no fused description"
    k_pos = torch.arange(70) + 5
    q_pos = k_pos[40:]  # distances 0..69: past the T5 max_distance and into the masked triangle
    d = causal_distance(q_pos, k_pos)
    for got, want in ((spec.bias_at(d), scheme.score_bias(q_pos, k_pos)),
                      (spec.weight_at(d), scheme.score_weight(q_pos, k_pos))):
        assert (got is None) == (want is None)
        if want is not None:
            torch.testing.assert_close(got.expand_as(want), want, rtol=1e-6, atol=1e-6)


def test_distance_kernel_gradients_reach_raw_parameters():
    torch.manual_seed(0)
    scheme = build_scheme("kerple_log_3para", SPEC)
    d = causal_distance(torch.arange(10), torch.arange(10))
    scheme.fused_kernel().bias_at(d).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scheme.parameters())


def test_unknown_bias_kind_is_refused():
    from megatron.positional.distance_kernel import DistanceKernel

    with pytest.raises(ValueError, match="unknown fused bias kind 'cubic'"):
        DistanceKernel(bias="cubic")


@pytest.mark.parametrize("name,bias,weight", [("kerple_log", True, False), ("kerple_power__ap", False, True),
                                              ("kerple_power_ap_ap", True, True), ("rpe", True, False),
                                              ("alibi", True, False), ("rotary", False, False),
                                              ("sandwich", True, False)])
def test_hook_flags_are_read_off_the_description(name, bias, weight):
    scheme = build_scheme(name, SPEC)
    assert (scheme.has_score_bias, scheme.has_score_weight) == (bias, weight)


def test_a_scheme_without_a_description_keeps_its_own_hooks():
    from megatron.positional.base import PositionalScheme

    class Custom(PositionalScheme):  # a bias no DistanceKernel kind expresses
        has_score_bias = True

        def fused_kernel(self):
            return None

        def score_bias(self, q_pos, k_pos):
            return (q_pos[:, None] * k_pos[None, :]).float()[None]

    scheme = Custom(SPEC)
    assert scheme.has_score_bias and not scheme.has_score_weight
    assert scheme.score_weight(torch.arange(3), torch.arange(3)) is None
    assert scheme.score_bias(torch.arange(3), torch.arange(3))[0, 2, 2] == 4
