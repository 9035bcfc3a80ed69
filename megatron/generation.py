"""What generate.py needs beyond the model: a bound on what a request may cost, and text streamed
as the tokens come.

A generation request whose kv-cache cannot fit (`--max-new-tokens 1000000000`) used to run on
until memory ran out, printing nothing: the cache holds k and v of every layer for every token, so
its size is known before the first step, and a request beyond the free memory is refused with what
fits. With an attention window the cache keeps W keys (kv_cache.py), so only time bounds it.
"""
from __future__ import annotations

import sys

import torch

from megatron.errors import UserError

# The cache grows by torch.cat (old + new -> a copy) every step: twice its size at the peak.
PEAK_FACTOR = 2
DECODE_CONTEXT = 16  # tokens decoded before a new one, so a tokenizer's joins (spaces, bytes) are kept


def kv_cache_bytes_per_token(model, device) -> int:
    """Bytes the kv-cache holds per token: k and v, every layer, every local head, the model's dtype."""
    param = next(model.parameters())
    return 2 * len(model.layers) * model.model_cfg.hidden_size * param.element_size()


def available_bytes(device) -> int:
    """Free memory for the cache on `device`: CUDA's free memory, or the host's available RAM."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    import psutil  # lazy: psutil is DeepSpeed's requirement, not ours

    return psutil.virtual_memory().available


def check_new_tokens_fit(model, prompt_tokens: int, max_new_tokens: int, device) -> None:
    """UserError naming --max-new-tokens unless the kv-cache for prompt + new tokens fits in memory."""
    if model.model_cfg.attention_window:  # the cache keeps at most W keys
        return
    per_token = kv_cache_bytes_per_token(model, device) * PEAK_FACTOR
    free = available_bytes(device)
    total = prompt_tokens + max_new_tokens
    if total * per_token <= free:
        return
    fit = max(free // per_token - prompt_tokens, 0)
    raise UserError(f"--max-new-tokens {max_new_tokens}: the kv-cache for the prompt's {prompt_tokens} + "
                    f"{max_new_tokens} tokens needs {total * per_token / 2**30:.1f} GiB on {device}, more than the "
                    f"{free / 2**30:.1f} GiB available: at most {fit} new tokens fit. Lower --max-new-tokens (or "
                    "bound the cache with an attention window: -o attention-window=W)")


class TokenStream:
    """Writes the text of generated tokens to `out` as they come. A character split over several
    tokens (byte-level BPE, UTF-8 bytes) is written once whole, never as U+FFFD; each new piece is
    the difference of decoding the last DECODE_CONTEXT written tokens with and without it."""

    def __init__(self, tokenizer, out=None):
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.ids: list[int] = []
        self.written = 0  # tokens whose text is out

    def push(self, token: int) -> None:
        self.ids.append(int(token))
        self._write(final=False)

    def finish(self) -> None:
        self._write(final=True)

    def _write(self, final: bool) -> None:
        start = max(0, self.written - DECODE_CONTEXT)
        before = self.tokenizer.detokenize(self.ids[start:self.written])
        after = self.tokenizer.detokenize(self.ids[start:])
        if not final and (after.endswith("\ufffd") or not after.startswith(before)):
            return  # an unfinished character: wait for its other tokens
        self.out.write(after[len(before):])
        self.out.flush()
        self.written = len(self.ids)
