"""Decoding with the kv-cache, and what generate.py needs beyond the model: a bound on what a
request may cost, and text streamed as the tokens come.

`decode` is the one decoding loop: generate.py (`generate_tokens`), the harness adapter's batched
generation (megatron/evaluation/harness/batching.py) and retrieval's greedy answers
(megatron/evaluation/retrieval/scoring.py) differ only in how a step's scores are computed, how a
token is picked from them, and when they stop reading.

A generation request whose kv-cache cannot fit (`--max-new-tokens 1000000000`) used to run on
until memory ran out, printing nothing: the cache holds k and v of every layer for every token, so
its size is known before the first step, and a request beyond the free memory is refused with what
fits. With an attention window the cache keeps W keys (kv_cache.py), so only time bounds it.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator

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


def decode(first: torch.Tensor, forward: Callable, pick: Callable) -> Iterator[torch.Tensor]:
    """Each row's next token, step after step: `pick(scores (B, V)) -> (B,)` picks from `first`
    (the scores after the prompt, which the caller has read into its cache), then from
    `forward(picked (B, 1)) -> (B, V)`, the scores after feeding the picked tokens through the
    cache. A generator: the caller stops reading when it has enough, so no step runs past it."""
    scores = first
    while True:
        picked = pick(scores)  # (B,)
        yield picked
        scores = forward(picked[:, None])


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    """(B, V) float logits -> temperature-scaled logits with everything outside top-k / top-p at -inf."""
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the token that crosses p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def generate_tokens(model, prompt: list[int], max_new_tokens: int, greedy=True, temperature=1.0, top_k=0,
                    top_p=1.0, generator=None, eod: int | None = None, vocab_limit: int | None = None,
                    on_token=None):
    """Continue `prompt` (token ids) with the kv cache; returns the new ids. `on_token(id)` is
    called with each one as it comes (generate.py streams its text)."""
    device = next(model.parameters()).device
    cache = model.new_cache()

    def forward(step):
        logits = model(step, cache=cache)[:, -1].float()  # (1, V)
        if vocab_limit is not None:  # padded vocab rows are not tokens
            logits[:, vocab_limit:] = float("-inf")
        return logits

    def pick(logits):
        if greedy:
            return logits.argmax(-1)
        probs = filter_logits(logits, temperature, top_k, top_p).softmax(-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    out = []
    if max_new_tokens < 1:
        return out
    with torch.no_grad():
        for nxt in decode(forward(torch.tensor([prompt], device=device)), forward, pick):
            out.append(int(nxt))
            if on_token is not None:
                on_token(out[-1])
            if (eod is not None and out[-1] == eod) or len(out) >= max_new_tokens:
                break
    return out
