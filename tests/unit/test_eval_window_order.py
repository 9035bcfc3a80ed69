"""Which windows evaluate.py scores: NeoX's shuffled sample order (the paper's draw, by default)
or the contiguous leading windows of the stream; reproducible by seed; a short split warns and
records the count.

The expected windows are restated here from NeoX's GPT2Dataset (one epoch): np RandomState(seed)
shuffles the split's documents, the stream is cut into L+1-token windows starting every L
tokens, then the same RandomState shuffles the window indices; the paper scores the first N."""
import json

import numpy as np
import pytest
import torch

from megatron.checkpoint import load_model as load_mod
from megatron.data.gpt_dataset import split_ranges
from megatron.data.indexed import MMapIndexedDataset
from megatron.evaluation import sweep as evaluate
from megatron.evaluation.lengths import evaluate_length
from megatron.model import GPTModel
from tests.conftest import checkpoint_layout
from tests.unit.test_gpt_dataset import make_dataset

SIZES = [30, 3, 55, 12, 80, 7, 41, 2, 19, 33, 64, 25]
SPLIT = "1,1,0"  # valid = the second half of the documents


class EchoModel:
    """Scores every target with its own token id: the positionwise result then names the windows."""
    vocab_size = None

    def token_losses(self, inputs, targets):
        return targets.float()


def neox_windows(prefix, seed, length, shuffled):
    """All windows of one epoch of the valid split, in NeoX's sample order or in stream order."""
    indexed = MMapIndexedDataset(prefix)
    start, end = split_ranges(len(indexed), SPLIT)[1]
    rng = np.random.RandomState(seed)
    docs = np.arange(start, end, dtype=np.int32)
    rng.shuffle(docs)
    stream = np.concatenate([indexed[int(d)] for d in docs]).astype(np.int64)
    n = (len(stream) - 1) // length
    order = np.arange(n, dtype=np.uint32)
    if shuffled:
        rng.shuffle(order)
    return [stream[int(k) * length: int(k) * length + length + 1] for k in order]


def expected_positionwise(windows, n):
    return np.stack([w[1:] for w in windows[:n]]).astype(np.float64).mean(0)


def run(prefix, tmp_path, seed=3, length=8, max_windows=5, order="shuffled"):
    return evaluate_length(EchoModel(), prefix, SPLIT, "valid", length, seed, max_windows, None,
                           cache_dir=str(tmp_path / "cache"), progress=False, window_order=order)


@pytest.fixture
def prefix(tmp_path):
    return make_dataset(tmp_path, SIZES)


@pytest.mark.parametrize("length", [8, 16])
def test_shuffled_windows_are_neox_sample_order(prefix, tmp_path, length):
    r = run(prefix, tmp_path, length=length)
    expect = expected_positionwise(neox_windows(prefix, 3, length, shuffled=True), 5)
    assert r.windows == 5 and r.requested == 5 and not r.short
    np.testing.assert_array_equal(r.positionwise, expect)


def test_contiguous_windows_are_the_leading_stream_windows_bit_for_bit(prefix, tmp_path):
    r = run(prefix, tmp_path, order="contiguous")
    np.testing.assert_array_equal(r.positionwise, expected_positionwise(neox_windows(prefix, 3, 8, shuffled=False), 5))
    # the same leading tokens at every length: 4 windows of 8 = 2 windows of 16
    a = run(prefix, tmp_path, length=8, max_windows=4, order="contiguous")
    b = run(prefix, tmp_path, length=16, max_windows=2, order="contiguous")
    assert a.positionwise.mean() == pytest.approx(b.positionwise.mean())


def test_reproducible_by_seed_and_seeds_differ(prefix, tmp_path):
    first, again = run(prefix, tmp_path, seed=3), run(prefix, tmp_path, seed=3)
    np.testing.assert_array_equal(first.positionwise, again.positionwise)
    other = run(prefix, tmp_path, seed=4)
    assert not np.array_equal(first.positionwise, other.positionwise)
    np.testing.assert_array_equal(other.positionwise,
                                  expected_positionwise(neox_windows(prefix, 4, 8, shuffled=True), 5))


def test_a_short_split_gives_every_window_once_and_records_the_count(prefix, tmp_path):
    r = run(prefix, tmp_path, length=32, max_windows=1000)
    every = neox_windows(prefix, 3, 32, shuffled=True)
    assert r.windows == len(every) < 1000 and r.requested == 1000 and r.short
    np.testing.assert_array_equal(r.positionwise, expected_positionwise(every, len(every)))


def test_unknown_window_order_is_refused(prefix, tmp_path):
    with pytest.raises(ValueError, match="window order must be one of shuffled, contiguous"):
        run(prefix, tmp_path, order="random")


def test_evaluate_cli_records_order_seed_and_counts_and_warns(tmp_path, tiny_config, token_dataset, monkeypatch, capsys):
    cfg = tiny_config(data_path=token_dataset, split="50,40,10")
    torch.manual_seed(0)
    model = GPTModel(cfg.model, 128).eval()
    monkeypatch.setattr(load_mod, "load_checkpoint_model", lambda *a, **k: (model, cfg, {"iteration": 4}))
    checkpoint_layout(tmp_path / "ck")
    out = tmp_path / "eval"
    common = ["--checkpoint", str(tmp_path / "ck"), "--lengths", "32,1024", "--max-windows", "4", "--quiet"]
    assert evaluate.main([*common, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    rec = json.loads((out / "eval.json").read_text())
    assert rec["window_order"] == "shuffled" and rec["data_seed"] == rec["seed"] == 1234
    short, full = rec["results"][1], rec["results"][0]
    assert full["windows"] == full["windows_requested"] == 4
    assert short["windows_requested"] == 4 and 1 <= short["windows"] < 4
    assert f"length 1024: the test split holds only {short['windows']} windows" in err
    assert "length 32:" not in err
    md = (out / "eval.md").read_text()
    assert f"{short['windows']} of 4" in md and "Windows: shuffled" in md and "data seed 1234" in md
    assert "shuffled,1234" in (out / "eval.csv").read_text()

    contiguous = tmp_path / "contiguous"
    assert evaluate.main([*common, "--out", str(contiguous), "--window-order", "contiguous", "--data-seed", "7"]) == 0
    rec_c = json.loads((contiguous / "eval.json").read_text())
    assert rec_c["window_order"] == "contiguous" and rec_c["data_seed"] == 7
    assert rec_c["results"][0]["loss"] != rec["results"][0]["loss"]  # other windows
