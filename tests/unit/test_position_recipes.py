"""Randomized positions and PoSE (megatron/data/position_recipes.py): the positions follow the
stated law and are a pure function of their seed coordinates; a relative scheme's loss depends only
on position differences; bad values are refused in one line by the config (dry run and training)."""
import numpy as np
import pytest
import torch

from megatron.attention.documents import PackedDocuments
from megatron.config import load_config
from megatron.config.errors import ConfigError
from megatron.config.scheme_options import scheme_names
from megatron.data.position_recipes import PositionRecipe, draw_generator, pose_positions, random_positions, to_device
from megatron.model import GPTModel
from tests.conftest import TINY_MODEL, write_yaml
from tests.unit.test_packed_documents import _model, _sdpa_cannot


def test_random_positions_are_a_uniform_sorted_draw():
    L, N, draws = 8, 40, 4000
    counts = np.zeros(N)
    for i in range(draws):
        pos = random_positions(L, N, draw_generator(1, i, 0, 0))
        assert torch.equal(pos, pos.sort().values) and pos.unique().numel() == L
        assert 0 <= int(pos.min()) and int(pos.max()) < N
        counts[pos.numpy()] += 1
    # each position is included with probability L / N: a chi-square test at 39 degrees of freedom
    expected = draws * L / N
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 72.0, chi2  # the 0.999 quantile of chi-square(39) is 72.05


def test_pose_positions_follow_the_paper():
    L, T, draws = 16, 64, 3000
    last_skip = np.zeros(T - L + 1)
    for i in range(draws):
        pos = pose_positions(L, T, 2, draw_generator(2, i, 0, 0))
        steps = (pos[1:] - pos[:-1]).tolist()
        assert int(pos[0]) == 0 and int(pos[-1]) <= T - 1
        assert sum(s != 1 for s in steps) <= 1 and min(steps) >= 1  # two chunks, consecutive inside
        last_skip[int(pos[-1]) - (L - 1)] += 1
    expected = draws / (T - L + 1)  # the skip is uniform on [0, T - L]
    chi2 = ((last_skip - expected) ** 2 / expected).sum()
    assert chi2 < 85.4, chi2  # the 0.999 quantile of chi-square(48)
    many = pose_positions(L, T, 5, draw_generator(3, 0, 0, 0))
    assert int(many[0]) == 0 and (many[1:] > many[:-1]).all()


def test_draws_are_a_pure_function_of_their_coordinates():
    recipe = PositionRecipe(random_max_length=100, seed=7)
    tokens = torch.ones(2, 10, dtype=torch.long)
    a = recipe.batch_inputs(tokens, 5, 1, 0)["positions"]
    assert torch.equal(a, recipe.batch_inputs(tokens, 5, 1, 0)["positions"])
    for other in ((6, 1, 0), (5, 0, 0), (5, 1, 1)):
        assert not torch.equal(a, recipe.batch_inputs(tokens, *other)["positions"])
    pose = PositionRecipe(skip_target_length=100, skip_chunks=3, seed=7)
    assert torch.equal(pose.batch_inputs(tokens, 5, 1, 0)["positions"], pose.batch_inputs(tokens, 5, 1, 0)["positions"])


@pytest.mark.parametrize("recipe", [PositionRecipe(random_max_length=100, seed=3),
                                    PositionRecipe(skip_target_length=100, skip_chunks=3, seed=3)])
def test_each_sequence_draws_its_own_positions(recipe):
    """The issue's law is per training sequence: the rows of one micro-batch draw apart, row b's
    draw is the same whatever the micro-batch size (a function of the coordinates and b alone)."""
    tokens = torch.ones(4, 10, dtype=torch.long)
    pos = recipe.batch_inputs(tokens, 5, 1, 0)["positions"]
    assert pos.shape == (4, 10) and pos.dtype == torch.int64
    assert len({tuple(row) for row in pos.tolist()}) == 4
    assert torch.equal(pos[:2], recipe.batch_inputs(tokens[:2], 5, 1, 0)["positions"])
    assert (pos[:, 1:] > pos[:, :-1]).all()


def _drawn_model(tiny_config, name, backend, length):
    return _model(tiny_config, name, backend, seq_length=length, max_positions=64, rpe_max_distance=40)


def _loss_and_grads(model, loss):
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("name", scheme_names())
def test_rows_at_their_own_positions_equal_each_row_alone(tiny_config, name, backend):
    """A micro-batch whose rows carry their own drawn positions ((B, L)) equals each row run alone
    at its positions: the loss (the rows' mean) and every parameter's gradient within 1e-6, fp32."""
    if backend == "sdpa" and _sdpa_cannot(name):
        pytest.skip("SDPA refuses score-weight schemes (resolver)")
    model = _drawn_model(tiny_config, name, backend, 12)
    tokens = torch.randint(1, 32, (3, 12), generator=torch.Generator().manual_seed(1))
    labels = torch.roll(tokens, -1, dims=1)
    drawn = to_device(PositionRecipe(skip_target_length=60, skip_chunks=3).batch_inputs(tokens, 0, 0, 0), "cpu")
    batch, batch_grads = _loss_and_grads(model, model(tokens, labels=labels, **drawn))
    rows = sum(model(tokens[b:b + 1], labels=labels[b:b + 1], positions=drawn["positions"][b]) for b in range(3)) / 3
    alone, alone_grads = _loss_and_grads(model, rows)
    assert abs(batch.item() - alone.item()) <= 1e-6, (batch.item(), alone.item())
    assert batch_grads.keys() == alone_grads.keys()
    for key, grad in batch_grads.items():
        torch.testing.assert_close(grad, alone_grads[key], rtol=0, atol=1e-6, msg=f"{name} {backend} {key}")


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("name", ["kerple_log", "rotary", "fire", "xpos"])
def test_drawn_rows_with_documents_equal_each_row_alone(tiny_config, name, backend):
    """reset-attention-mask with randomized positions: every row keeps its documents and its draw."""
    model = _drawn_model(tiny_config, name, backend, 16)
    tokens = torch.randint(1, 32, (2, 16), generator=torch.Generator().manual_seed(2))
    tokens[0, 5] = tokens[1, 9] = tokens[1, 12] = 0  # EOD
    labels = torch.roll(tokens, -1, dims=1)
    drawn = to_device(PositionRecipe(eod=0, reset_attention_mask=True, random_max_length=64)
                      .batch_inputs(tokens, 2, 0, 0), "cpu")
    assert drawn["positions"].shape == (2, 16)
    batch, batch_grads = _loss_and_grads(model, model(tokens, labels=labels, **drawn))
    rows = sum(model(tokens[b:b + 1], labels=labels[b:b + 1], positions=drawn["positions"][b],
                     documents=PackedDocuments(drawn["documents"].starts[b:b + 1])) for b in range(2)) / 2
    alone, alone_grads = _loss_and_grads(model, rows)
    assert abs(batch.item() - alone.item()) <= 1e-6
    for key, grad in batch_grads.items():
        torch.testing.assert_close(grad, alone_grads[key], rtol=0, atol=1e-6, msg=f"{name} {backend} {key}")


# Every scheme but the absolute ones: embeddings of positions, and FIRE's query position (by design).
RELATIVE = [n for n in scheme_names() if n not in ("learned", "sinusoidal", "fire")]


@pytest.mark.parametrize("name", RELATIVE)
def test_relative_loss_depends_only_on_differences(tiny_config, name):
    """Positions drawn by a recipe (gapped) shifted by c: the loss of a relative scheme is unchanged."""
    weight = name.startswith("kerple_power") and name.endswith("_ap")  # a score weight: SDPA refuses it
    cfg = tiny_config(pos_emb=name, attention_backend="reference" if weight else "sdpa",
                      num_layers=1, hidden_size=16, num_attention_heads=2, rpe_num_buckets=8, rpe_max_distance=40)
    torch.manual_seed(0)
    model = GPTModel(cfg.model, 32).train()
    tokens = torch.randint(1, 32, (2, 12))
    labels = torch.roll(tokens, -1, dims=1)
    pos = pose_positions(12, 60, 3, draw_generator(0, 0, 0, 0))
    losses = [model(tokens, labels=labels, positions=pos + c).item() for c in (0, 37)]
    assert abs(losses[0] - losses[1]) <= (2e-6 if name in ("rotary", "xpos") else 1e-6), losses  # angles of larger positions


def _load(tmp_path, **over):
    data = {**TINY_MODEL, "run-dir": str(tmp_path / "run"), **over}
    return load_config([write_yaml(tmp_path / "bad.yml", data)])


@pytest.mark.parametrize("over,key", [
    ({"pos-random-max-length": 16}, "pos-random-max-length"),  # shorter than seq-length 32
    ({"pos-skip-target-length": 64, "pos-skip-chunks": 0}, "pos-skip-chunks"),
    ({"pos-skip-target-length": 20}, "pos-skip-target-length"),
    ({"reset-position-ids": True}, "reset-position-ids"),  # without reset-attention-mask
    ({"pos-emb": "learned", "pos-random-max-length": 64}, "pos-random-max-length"),  # past the table
    ({"pos-random-max-length": 64, "pos-skip-target-length": 64}, "pos-skip-target-length"),
])
def test_bad_values_are_refused_naming_the_key(tmp_path, over, key):
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, **over)
    problems = [line for line in str(err.value).splitlines() if line.strip().startswith("-")]
    assert len(problems) == 1 and key in problems[0], str(err.value)


def test_good_values_load(tmp_path):
    cfg = _load(tmp_path, **{"reset-attention-mask": True, "reset-position-ids": True})
    assert "restart at each document" in cfg.describe()
    cfg = _load(tmp_path, **{"pos-skip-target-length": 128, "pos-skip-chunks": 3})
    assert "PoSE: 3 chunks" in cfg.describe()


@pytest.mark.parametrize("bad", [torch.arange(11), torch.arange(24).view(2, 12), torch.arange(12.0)])
def test_positions_of_the_wrong_shape_are_refused(tiny_config, bad):
    model = _drawn_model(tiny_config, "kerple_log", "sdpa", 12)
    with pytest.raises(ValueError, match=r"positions must be a \(12,\) or \(3, 12\) integer tensor"):
        model(torch.ones(3, 12, dtype=torch.long), positions=bad)
