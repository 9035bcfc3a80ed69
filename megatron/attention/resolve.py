"""Pick an attention backend for (scheme, device, dtype, mode). No silent fallback: an explicit
name that cannot run raises; only "auto" chooses, and it logs what it chose."""
from __future__ import annotations

import logging

import torch

from megatron.attention.base import AttentionBackend
from megatron.attention.registry import backend_classes

logger = logging.getLogger("megatron.attention")

# CPU inference over full sequences of at least this many tokens, for a scheme SDPA cannot run (a
# score weight: kerple_power_*_ap): "auto" takes compiled flex over the reference backend's
# materialised scores; from 4,096 tokens one such forward costs more than flex's compile (4-30 s,
# measured against SDPA's unfused math path, which computes what the reference does). A scheme
# SDPA runs stays on SDPA at every length: per call its CPU inference route (sdpa.py) measured as
# fast as compiled flex at 4,096 tokens and faster from 8,192 to 16,384, and at 2,048 flex's
# ~10% lead does not pay back its compile within an evaluation; no compile at all
# (docs/benchmarks.md, "evaluation forward", 2-core CPU, 1 thread, 4x256 model).
CPU_FLEX_MIN_TOKENS = 4096


def backend_names() -> list[str]:
    """Registered backend names in "auto" preference order (reference last)."""
    return list(backend_classes())


def _supporting(scheme, device, dtype, training, dropout, padded=False, documents=False, sampled=False) -> list[str]:
    return [n for n, cls in backend_classes().items()
            if _reason(cls(), scheme, device, dtype, training, dropout, padded, documents, sampled) is None]


def _reason(backend, scheme, device, dtype, training, dropout, padded, documents=False, sampled=False) -> str | None:
    """Why `backend` cannot run the case, or None; `padded`: the batch has padded rows;
    `documents`: rows hold packed documents (reset-attention-mask); `sampled`: the positions are a
    training recipe's draw, with gaps (pos-random-max-length, pos-skip-target-length)."""
    if padded and not backend.takes_padding:
        return "it takes no padded batches (no key-padding mask)"
    if documents and backend.documents_refusal:
        return backend.documents_refusal
    if sampled and backend.sampled_positions_refusal:
        return backend.sampled_positions_refusal
    return backend.unsupported_reason(scheme, device, dtype, training, dropout=dropout)


def describe_case(scheme, device: torch.device, dtype: torch.dtype, training: bool) -> str:
    return f"pos-emb {scheme.name!r} on {device.type}/{str(dtype).replace('torch.', '')}" + (
        " (training)" if training else " (inference)")


def long_cpu_inference(device: torch.device | str, training: bool, tokens: int | None) -> bool:
    """The case where "auto" prefers compiled flex on CPU for schemes SDPA cannot run (see
    CPU_FLEX_MIN_TOKENS)."""
    return torch.device(device).type == "cpu" and not training and (tokens or 0) >= CPU_FLEX_MIN_TOKENS


def auto_backend(scheme, device, dtype, training, dropout=False, tokens=None, padded=False, documents=False,
                 sampled=False) -> AttentionBackend:
    """The best-ranked backend that supports the case; reference always does. `tokens`: the
    full-sequence length (queries = keys) when known, for the long CPU inference rule."""
    if long_cpu_inference(device, training, tokens):
        flex, sdpa = backend_classes().get("flex"), backend_classes().get("sdpa")
        kernel = scheme.fused_kernel()
        if (flex is not None and kernel is not None and not kernel.is_plain
                and (sdpa is None or sdpa().unsupported_reason(scheme, device, dtype, training, dropout=dropout))
                and flex().unsupported_reason(scheme, device, dtype, training, dropout=dropout) is None):
            return flex()
    ranked = []
    for name, cls in backend_classes().items():
        backend = cls()
        if _reason(backend, scheme, device, dtype, training, dropout, padded, documents, sampled) is not None:
            continue
        rank = backend.auto_rank(scheme, device, dtype, training)
        if rank is not None:
            ranked.append((rank, name, backend))
    if not ranked:
        raise AssertionError(f"no backend supports {describe_case(scheme, device, dtype, training)}; "
                             "the reference backend should")
    return min(ranked, key=lambda r: (r[0], r[1]))[2]


def resolve_backend(name: str, scheme, device: torch.device | str, dtype: torch.dtype,
                    training: bool, dropout: bool = False, tokens: int | None = None,
                    padded: bool = False, documents: bool = False, sampled: bool = False) -> AttentionBackend:
    """`dropout`: attention dropout > 0 will be applied (fused kernels without dropout refuse).
    `tokens`: the full-sequence length (queries = keys, no kv-cache), for "auto" only.
    `padded`: the batch has left-padded rows (a key-padding mask: megatron/attention/mask.py).
    `documents`, `sampled`: packed documents, positions a training recipe drew (_reason).

    Runs without autograd: the backends' checks may evaluate the scheme (fused_kernel() clamps
    its parameters), and the pipeline model resolves inside an activation-checkpointed layer on
    its first call only, so recorded ops there would make the recomputation save a different
    number of tensors than the original forward (torch.utils.checkpoint.CheckpointError)."""
    with torch.no_grad():
        return _resolve(name, scheme, device, dtype, training, dropout, tokens, padded, documents, sampled)


def _resolve(name, scheme, device, dtype, training, dropout, tokens=None, padded=False, documents=False,
             sampled=False) -> AttentionBackend:
    device = torch.device(device)
    classes = backend_classes()
    where = describe_case(scheme, device, dtype, training)
    if name == "auto":
        backend = auto_backend(scheme, device, dtype, training, dropout, tokens, padded, documents, sampled)
        logger.info("attention backend auto -> %s for %s", backend.name, where)
        return backend
    if name not in classes:
        raise ValueError(f"unknown attention backend {name!r}; choose 'auto' or one of: "
                         f"{', '.join(classes)}")
    backend = classes[name]()
    reason = _reason(backend, scheme, device, dtype, training, dropout, padded, documents, sampled)
    if reason is not None:
        supporting = _supporting(scheme, device, dtype, training, dropout, padded, documents, sampled)
        raise ValueError(f"attention backend {name!r} cannot run {where}: {reason}. Backends that "
                         f"support it: {', '.join(supporting)} "
                         "(or use 'auto')")
    return backend
