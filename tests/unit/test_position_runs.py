"""Positions the model makes itself, known on the host (megatron/positional/distance.py
position_run): every check that reads them answers as it would from the device, and a tensor
changed since it was made is read from the device again."""
import itertools

import pytest
import torch

from megatron.attention.mask import consecutive_starts, query_blocks
from megatron.model.kv_cache import KVCache
from megatron.positional.distance import largest_distance, position_run, run_slice, run_start


def unmarked(pos: torch.Tensor) -> torch.Tensor:
    return pos.clone()  # the same values, no host mark: every check reads the device


def test_a_run_answers_as_its_values_do():
    q, k = position_run(5, 4, "cpu"), position_run(2, 7, "cpu")
    assert torch.equal(q, torch.arange(5, 9)) and q.dtype == torch.int64
    assert run_start(q) == 5 and run_start(unmarked(q)) is None
    assert consecutive_starts(q, k) == consecutive_starts(unmarked(q), unmarked(k)) == (5, 2)
    assert largest_distance(q, k) == 8 - 2 and largest_distance(unmarked(q), k) is None
    assert largest_distance(position_run(0, 3, "cpu"), position_run(7, 2, "cpu")) == 0  # all above the diagonal


def test_a_run_changed_in_place_is_read_from_the_device():
    pos = position_run(0, 6, "cpu")
    pos.add_(10)
    assert run_start(pos) is None
    assert consecutive_starts(pos, pos) == (10, 10)
    gapped = position_run(0, 6, "cpu")
    gapped[3] = 40
    assert consecutive_starts(gapped, gapped) is None


def test_a_slice_of_a_run_is_a_run():
    pos = position_run(3, 10, "cpu")
    assert run_slice(pos, slice(None)) is pos
    for index in (slice(2, 7), slice(4, None), slice(None, 3), slice(8, 50), slice(-3, None)):
        part = run_slice(pos, index)
        assert torch.equal(part, pos[index]) and run_start(part) == int(pos[index][0])
    assert run_start(run_slice(pos, slice(0, 10, 2))) is None  # every other position: not a run
    assert run_start(run_slice(pos, torch.tensor([1, 2]))) is None


@pytest.mark.parametrize("q0,lq,k0,lk,span", [(0, 10, 0, 10, 3), (7, 5, 0, 12, 2), (20, 9, 4, 25, 4), (3, 6, 5, 4, 2)])
def test_query_blocks_of_runs_see_the_keys_the_device_form_finds(q0, lq, k0, lk, span):
    q, k = position_run(q0, lq, "cpu"), position_run(k0, lk, "cpu")
    host, device = query_blocks(q, k, span), query_blocks(unmarked(q), unmarked(k), span)
    assert [rows for rows, _ in host] == [rows for rows, _ in device]
    for (_, keys), (_, found) in zip(host, device):
        assert torch.equal(k[keys], k[found])


@pytest.mark.parametrize("window", [None, 1, 3])
def test_the_kv_cache_keeps_the_keys_the_device_form_keeps(window):
    """Decoding in steps of 2, 1, 3, ... tokens, then a blockwise trim: every step's positions
    equal those of a cache whose kept positions carry no mark (the device path)."""
    host, device = KVCache(1, window), KVCache(1, window)
    for new in itertools.islice(itertools.cycle([2, 1, 3]), 7):
        steps = []
        for cache in (host, device):
            q_pos, k_pos = cache.step_positions(new, "cpu")
            steps.append((q_pos, k_pos))
            cache.layer(0).update(torch.zeros(1, 1, new, 2), torch.zeros(1, 1, new, 2))
            cache.advance(k_pos)
            if cache is device:
                cache.positions = unmarked(cache.positions)
        assert all(torch.equal(a, b) for a, b in zip(*steps))
        assert run_start(steps[0][0]) is not None and run_start(steps[0][1]) is not None
        assert host.length == device.length and torch.equal(host.positions, device.positions)
        assert host.kv[0][0].shape == device.kv[0][0].shape
    for cache in (host, device):
        cache.keep_from(host.length - 2)
    assert torch.equal(host.positions, device.positions) and host.kv[0][0].shape == device.kv[0][0].shape
