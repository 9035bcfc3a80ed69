"""Dropout RNG for tensor-parallel regions, without megatron-core's CUDA-only tracker.

Megatron keeps two streams: the default generator (same seed on every TP rank, so dropout on
replicated activations -- embedding and hidden dropout -- draws the same mask on every rank) and a
"model-parallel" stream seeded seed + 2718 + tp_rank for dropout on activations that are split
across TP ranks (the attention probabilities of this rank's heads), so each rank's heads get
independent masks. megatron-core's CudaRNGStatesTracker swaps CUDA generator states; this does the
same with the generator of whatever device the tensors live on (CPU included).
"""
from __future__ import annotations

import contextlib

import torch

# NeoX / Megatron: model_parallel_cuda_manual_seed uses seed + 2718 + tp_rank for the TP stream.
TP_SEED_OFFSET = 2718


def _get_state(device: str) -> torch.Tensor:
    return torch.get_rng_state() if device == "cpu" else torch.cuda.get_rng_state()


def _set_state(device: str, state: torch.Tensor) -> None:
    if device == "cpu":
        torch.set_rng_state(state)
    else:
        torch.cuda.set_rng_state(state)


class TensorParallelRNG:
    """One extra generator stream per device type, entered with `fork(device)`.

    Unseeded (tp_size == 1) `fork` is a no-op, so single-rank runs draw exactly as before."""

    def __init__(self):
        self.seed_value: int | None = None
        self._states: dict[str, torch.Tensor] = {}

    def seed(self, seed: int, tp_rank: int) -> None:
        self.seed_value = seed + TP_SEED_OFFSET + tp_rank
        self._states = {}

    def _initial_state(self, device: str) -> torch.Tensor:
        outer = _get_state(device)
        (torch.manual_seed if device == "cpu" else torch.cuda.manual_seed)(self.seed_value)
        state = _get_state(device)
        _set_state(device, outer)
        return state

    @contextlib.contextmanager
    def fork(self, device: torch.device | str = "cpu"):
        """Run the body on the TP stream of `device`, then restore the default stream."""
        if self.seed_value is None:
            yield
            return
        dev = torch.device(device).type
        if dev not in self._states:
            self._states[dev] = self._initial_state(dev)
        outer = _get_state(dev)
        _set_state(dev, self._states[dev])
        try:
            yield
        finally:
            self._states[dev] = _get_state(dev)
            _set_state(dev, outer)

    def checkpoint_context_fn(self):
        """`context_fn` for torch.utils.checkpoint (non-reentrant): it restores the default
        generator for the recomputation itself; this makes the recomputation replay the same
        TP-stream draws too, so attention dropout masks match the first forward."""
        saved: dict[str, torch.Tensor] = {}

        @contextlib.contextmanager
        def forward():
            saved.update(self._states)
            yield

        @contextlib.contextmanager
        def recompute():
            current, self._states = self._states, dict(saved)
            try:
                yield
            finally:
                self._states = current

        return forward(), recompute()

    def state_dict(self) -> dict:
        return {"seed_value": self.seed_value, "states": dict(self._states)}

    def load_state_dict(self, state: dict) -> None:
        self.seed_value = state["seed_value"]
        self._states = dict(state["states"])


def check_sequence_parallel(sequence_parallel: bool) -> None:
    """sequence-parallel: true cannot run here; say why instead of failing deep in megatron-core."""
    if not sequence_parallel:
        return
    if not torch.cuda.is_available():
        raise ValueError(
            "sequence-parallel: true needs CUDA (megatron-core's sequence-parallel layers gather "
            "into a buffer on torch.cuda.current_device()), and this machine has no GPU; set "
            "sequence-parallel: false (tensor parallelism itself works on CPU)")
    raise ValueError("sequence-parallel: true is not implemented by this model yet; "
                     "set sequence-parallel: false")
