"""KerpleLM: lm-evaluation-harness's language-model interface over one of our models.

Built on the harness's TemplateLM, so a (context, continuation) pair is split into tokens exactly
as its `hf` model splits it (`_encode_pair`: trailing spaces of the context move to the
continuation; the continuation's tokens are those of context+continuation past the context's).
Inputs longer than `max_length` lose tokens on the LEFT, as the `hf` model's do:
(context + continuation)[-(max_length + 1):][:-1]. `max_length` may exceed the training length:
our positional schemes extrapolate (run.py refuses a length the scheme cannot represent).
"""
from __future__ import annotations

import json

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from megatron.errors import UserError
from megatron.evaluation.harness.batching import generate, score_continuations

DEFAULT_MAX_GEN_TOKS = 256  # the `hf` model's default
SUPPORTED_GEN_KWARGS = {"until", "max_gen_toks", "do_sample", "temperature"}


class KerpleLM(TemplateLM):
    def __init__(self, model, tokenizer, max_length: int, batch_size: int = 1,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, seed: int = 1234):
        super().__init__()
        self.model, self.tok = model.eval(), tokenizer
        self._max_length, self.batch_size, self.max_gen_toks = max_length, batch_size, max_gen_toks
        self._device = next(model.parameters()).device
        self.generator = torch.Generator(device=self._device).manual_seed(seed)

    # ---- what TemplateLM needs -----------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tok.eod

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return type(self.tok).__name__

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tok.tokenize(string)  # our tokenizers add no special tokens

    def tok_decode(self, tokens) -> str:
        return self.tok.detokenize(list(tokens))

    def _scored(self, context: list[int], continuation: list[int]) -> tuple[list[int], list[int]]:
        """(model input, targets) for one pair, cut on the left to max_length as the hf model does."""
        if len(continuation) > self.max_length:
            raise UserError(f"a continuation of {len(continuation)} tokens does not fit --max-length "
                            f"{self.max_length}; raise --max-length")
        return (context + continuation)[-(self.max_length + 1):][:-1], continuation

    def _score(self, pairs, disable_tqdm: bool, desc: str) -> list[tuple[float, bool]]:
        with tqdm(total=len(pairs), disable=disable_tqdm, desc=desc) as bar:
            return score_continuations(self.model, [self._scored(c, t) for c, t in pairs], self.batch_size,
                                       self._device, bar.update)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        results = self._score([(ctx, cont) for _, ctx, cont in requests], disable_tqdm, "loglikelihood")
        for (key, _, _), res in zip(requests, results):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Every token of each text, in disjoint windows of max_length tokens (the first one
        conditioned on eot), as the hf model: lm_eval.utils.get_rolling_token_windows."""
        windows, owner = [], []
        for i, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(
                    self.tok_encode(text), self.prefix_token_id, self.max_length, context_len=1)):
                windows.append((ctx, cont))
                owner.append(i)
        scores = self._score(windows, disable_tqdm, "loglikelihood_rolling")
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, scores):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Requests with the same generation settings run together, batch_size prompts at a time
        (left-padded: batching.py); results come back in the order given."""
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1] or {}, sort_keys=True, default=str), []).append(i)
        out: list[str | None] = [None] * len(requests)
        with tqdm(total=len(requests), disable=disable_tqdm, desc="generate_until") as bar:
            for indices in groups.values():
                kw = dict(requests[indices[0]].args[1] or {})
                texts = self._generate_group([requests[i].args[0] for i in indices], kw, bar.update)
                for i, text in zip(indices, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _generate_group(self, contexts: list[str], kw: dict, progress) -> list[str]:
        unknown = set(kw) - SUPPORTED_GEN_KWARGS
        if unknown:
            raise UserError(f"generation settings {sorted(unknown)} are not supported by this adapter "
                            f"(supported: {sorted(SUPPORTED_GEN_KWARGS)})")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        eot_text = self.tok_decode([self.eot_token_id])
        if eot_text:
            until.append(eot_text)
        budget = int(kw.get("max_gen_toks", self.max_gen_toks))
        room = self.max_length - budget
        if room < 1:
            raise UserError(f"max_gen_toks {budget} leaves no room for the prompt within --max-length "
                            f"{self.max_length}; raise --max-length")
        prompts = [self.tok_encode(context)[-room:] or [self.prefix_token_id] for context in contexts]
        temperature = float(kw.get("temperature", 0.0) or 0.0)
        sample = None
        if kw.get("do_sample") and temperature > 0:
            def sample(logits):
                return torch.multinomial((logits / temperature).softmax(-1), 1, generator=self.generator)[:, 0]

        def stop(new: list[int]) -> bool:
            return new[-1] == self.eot_token_id or any(s in self.tok_decode(new) for s in until)

        texts = []
        for new in generate(self.model, prompts, [budget] * len(prompts), stop, sample, self._device, progress,
                            batch_size=self.batch_size):
            text = self.tok_decode(new)
            for s in until:  # cut at the first stop sequence, as the hf model does
                text = text.split(s)[0]
            texts.append(text)
        return texts
