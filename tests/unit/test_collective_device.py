"""Every collective the trainer issues hands the process group a tensor on the group's device
(megatron/device.py collective_device): nccl refuses CPU tensors as soon as there are two ranks,
which a one-GPU machine never shows. A two-rank nccl group is simulated: all_reduce records the
device of what it was given and stops there."""
from types import SimpleNamespace

import pytest
import torch

from megatron.device import collective_device

GROUP_DEVICE = torch.device("meta")  # stands for cuda:N: a device no CPU code path creates by itself
# megatron.device itself for the trainer, which imports collective_device when it calls it
COLLECTIVE_CALLERS = ("megatron.device", "megatron.process.stop_signals", "megatron.training.checkpoint",
                      "megatron.training.throughput", "megatron.training.health")


class Sent(Exception):
    pass


@pytest.fixture
def nccl_pair(monkeypatch):
    sent = []

    def all_reduce(tensor, *args, **kwargs):
        sent.append(tensor.device)
        raise Sent

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    for module in COLLECTIVE_CALLERS:  # each looks collective_device up where it imported it
        monkeypatch.setattr(f"{module}.collective_device", lambda: GROUP_DEVICE)
    return sent


def test_collective_device_follows_the_backend(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "nccl")
    assert collective_device() == torch.device("cuda", 1)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda group=None: "gloo")
    assert collective_device() == torch.device("cpu")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    assert collective_device() == torch.device("cpu")


def _preemption_flag():
    from megatron.process.stop_signals import PreemptionHandler

    PreemptionHandler().requested()


def _validation_mean():
    from megatron.training.trainer import Trainer

    Trainer._all_reduce_mean(SimpleNamespace(dist=SimpleNamespace(world_size=2)), torch.tensor(1.5))


def _save_barrier():
    from megatron.training.checkpoint import _all_ranks_ok

    _all_ranks_ok(True)


def _parameter_count():
    from megatron.training.throughput import full_parameter_count

    full_parameter_count(torch.nn.Linear(2, 2), None, 1)


def _weights_finite():
    from megatron.training.health import weights_finite

    weights_finite(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("call", [_preemption_flag, _validation_mean, _save_barrier, _parameter_count,
                                  _weights_finite])
def test_collectives_use_the_group_device(nccl_pair, call):
    with pytest.raises(Sent):
        call()
    assert nccl_pair == [GROUP_DEVICE]
