"""Retrieval prompts at a length and a needle depth: passkey retrieval and key-value needles with
distractors (RULER's multi-key form).

A prompt is a pure function of (task, seed, length, depth, index) and the tokenizer: the same on
every machine and for every rank count (its draws come from numpy's PCG64 seeded by that tuple).

Layout, in tokens (each part tokenized on its own, so the count is exact):

    intro | filler[:a] | needle | filler[a:] | question      -> exactly `length` tokens
    answer                                                   -> what the model must continue with

`depth` (percent) places the queried needle in the filler: a = round(depth / 100 * F), F the
filler's token count, so 0 is right after the intro and 100 right before the question. The
key-value task adds distractor needles (other keys, other values) at depths drawn from the seed.
The model reads exactly `length` tokens before the answer; the answer's own tokens come after.

Multiple choice: the answer's value against K-1 other values of the same format AND the same
token count under this tokenizer (a shorter candidate would win on fewer factors of the chain
rule); the key-value task's candidates include the distractors' values first, the hardest wrong
answers. Chance is 1/K.

Filler: `sentences`, the classic repeated sentences of passkey retrieval (Mohtashami & Jaggi
2023), or `split`, the evaluation split's own tokens from a seeded offset in its document stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from megatron.data.retrieval_text import ADJECTIVES, CLASSIC_FILLER, NOUNS, TASKS
from megatron.errors import UserError

FILLERS = ("sentences", "split")


@dataclass(frozen=True)
class Prompt:
    task: str
    length: int
    depth: float
    index: int
    tokens: list[int]  # exactly `length`
    needle_at: int  # the queried needle's first token in `tokens`
    candidates: list[list[int]]  # K continuations, each the same number of tokens
    candidate_texts: list[str]
    answer_index: int  # which candidate is right
    filler_before: int  # filler tokens before the queried needle: round(depth / 100 * filler_total)
    filler_total: int
    key: str | None = None
    distractor_keys: list[str] = field(default_factory=list)

    @property
    def answer_text(self) -> str:
        return self.candidate_texts[self.answer_index]

    @property
    def answer_tokens(self) -> list[int]:
        return self.candidates[self.answer_index]


class SplitFiller:
    """Filler from the evaluation split's document stream: `take(n, rng)` reads n tokens from an
    offset the rng draws (so a prompt's filler is part of its pure function)."""

    def __init__(self, prefix: str, split: str, split_name: str):
        from megatron.data.gpt_dataset import SPLIT_NAMES, split_ranges  # lazy: numpy-only data code
        from megatron.data.indexed import MMapIndexedDataset

        self.indexed = MMapIndexedDataset(prefix)
        start, end = split_ranges(len(self.indexed), split)[SPLIT_NAMES.index(split_name)]
        self.docs = np.arange(start, end)
        sizes = self.indexed.sizes[self.docs].astype(np.int64)
        self.ends = np.cumsum(sizes)
        self.total = int(self.ends[-1]) if len(self.ends) else 0
        self.where = f"the {split_name} split of {prefix}"

    def take(self, n: int, rng: np.random.Generator) -> list[int]:
        if n > self.total:
            raise UserError(f"{self.where} holds {self.total} tokens, fewer than the {n} filler tokens one prompt "
                            "needs at this length: use --retrieval-filler sentences, or a larger split")
        offset = int(rng.integers(0, self.total - n + 1))
        out: list[int] = []
        doc = int(np.searchsorted(self.ends, offset, side="right"))
        inside = offset - (int(self.ends[doc - 1]) if doc else 0)
        while len(out) < n:
            size = int(self.indexed.sizes[self.docs[doc]])
            part = self.indexed.get(int(self.docs[doc]), inside, min(size - inside, n - len(out)))
            out.extend(int(t) for t in part)
            doc, inside = doc + 1, 0
        return out


class SentenceFiller:
    """The classic filler: its sentences tokenized once and repeated."""

    def __init__(self, tokenizer):
        self.unit = tokenizer.tokenize(CLASSIC_FILLER)

    def take(self, n: int, rng: np.random.Generator) -> list[int]:
        del rng  # the same text for every prompt, as in the passkey papers
        reps = -(-n // len(self.unit)) if n else 0
        return (self.unit * reps)[:n]


class PromptMaker:
    """Builds the prompts of one task for one tokenizer and filler; `check()` refuses a tokenizer
    that cannot spell the task's words and digits, before any work."""

    def __init__(self, task: str, tokenizer, filler, candidates: int, seed: int):
        if task not in TASKS:
            raise UserError(f"retrieval task {task!r} is not one of {', '.join(TASKS)}")
        if candidates < 2:
            raise UserError(f"--retrieval-candidates {candidates}: multiple choice needs at least 2 candidates "
                            "(the answer and one other value)")
        self.name, self.text, self.tok, self.filler = task, TASKS[task], tokenizer, filler
        self.k, self.seed = candidates, seed
        self.check()

    def check(self) -> None:
        """Every piece round-trips through the tokenizer (digits included), so the needle the model
        reads is the one the answer names."""
        probe = [self.text.intro, self.text.needle.format(key="amber anchor", value="1234567890"),
                 self.text.question.format(key="amber anchor"), " 1234567890"]
        for piece in probe:
            back = self.tok.detokenize(self.tok.tokenize(piece))
            if back != piece:
                raise UserError(f"the checkpoint's tokenizer cannot spell the {self.name} task's text: {piece!r} comes "
                                f"back as {back!r}; retrieval needs a tokenizer that round-trips digits and plain "
                                "English (CharLevel, GPT-2 BPE, a Hugging Face tokenizer)")

    def fixed_tokens(self, length: int) -> int:
        """Tokens of a prompt that are not filler (an upper bound over keys and values)."""
        needles = (1 + self.text.distractors) * len(self.tok.tokenize(
            self.text.needle.format(key="amber anchor", value="9" * self.text.digits)))
        return (len(self.tok.tokenize(self.text.intro)) + needles
                + len(self.tok.tokenize(self.text.question.format(key="amber anchor"))) + 8)

    def make(self, length: int, depth: float, index: int, with_needle: bool = True) -> Prompt:
        """The prompt at these coordinates. with_needle=False: the control, the same prompt with the
        queried needle's tokens given to the filler instead (nothing in it names the answer, so any
        model scores chance, 1/K)."""
        rng = np.random.default_rng([self.seed, self.text.code, length, round(depth * 1000), index])
        t = self.text
        keys = _distinct_keys(rng, 1 + t.distractors) if t.distractors or "{key}" in t.question else [None]
        values = _distinct_values(rng, len(keys), t.digits)
        needles = [self.tok.tokenize(t.needle.format(key=k, value=v)) for k, v in zip(keys, values)]
        intro = self.tok.tokenize(t.intro)
        question = self.tok.tokenize(t.question.format(key=keys[0]))
        if not with_needle:
            needles[0] = []
        fill = length - len(intro) - sum(map(len, needles)) - len(question)
        if fill < 0:
            raise UserError(f"length {length} is too short for a {self.name} prompt: its text alone takes "
                            f"{length - fill} tokens; use lengths of at least {length - fill + 16}")
        filler = self.filler.take(fill, rng)
        # where each needle goes in the filler: the queried one at the depth, distractors drawn
        spots = [round(depth / 100 * fill)] + [int(rng.integers(0, fill + 1)) for _ in needles[1:]]
        order = sorted(range(len(needles)), key=lambda i: (spots[i], i))
        tokens, at, taken = list(intro), 0, 0
        for i in order:
            tokens += filler[taken:spots[i]]
            taken = spots[i]
            if i == 0:
                at = len(tokens)
            tokens += needles[i]
        tokens += filler[taken:] + question
        assert len(tokens) == length, (len(tokens), length)
        texts, answer = self._candidates(rng, values)
        return Prompt(self.name, length, depth, index, tokens, at, [self.tok.tokenize(c) for c in texts], texts,
                      answer, spots[0], fill, key=keys[0], distractor_keys=[k for k in keys[1:] if k])

    def _candidates(self, rng, values: list[str]) -> tuple[list[str], int]:
        """K continuations of the answer's token count: the answer, the distractors' values, then
        fresh values; shuffled by the rng. Returns (texts, index of the answer)."""
        want = len(self.tok.tokenize(f" {values[0]}"))
        chosen = [f" {values[0]}"] + [f" {v}" for v in values[1:] if len(self.tok.tokenize(f" {v}")) == want]
        chosen = chosen[:self.k]
        for _ in range(1000 * self.k):
            if len(chosen) == self.k:
                break
            v = f" {_value(rng, self.text.digits)}"
            if v not in chosen and len(self.tok.tokenize(v)) == want:
                chosen.append(v)
        if len(chosen) < self.k:
            raise UserError(f"the tokenizer spells too few {self.text.digits}-digit values in {want} tokens to draw "
                            f"{self.k} candidates; lower --retrieval-candidates")
        perm = rng.permutation(self.k)
        return [chosen[i] for i in perm], int(np.nonzero(perm == 0)[0][0])


def _value(rng, digits: int) -> str:
    return str(int(rng.integers(10 ** (digits - 1), 10 ** digits)))


def _distinct_values(rng, n: int, digits: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        v = _value(rng, digits)
        if v not in out:
            out.append(v)
    return out


def _distinct_keys(rng, n: int) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        k = f"{ADJECTIVES[int(rng.integers(len(ADJECTIVES)))]} {NOUNS[int(rng.integers(len(NOUNS)))]}"
        if k not in out:
            out.append(k)
    return out


def parse_depths(text: str) -> list[float]:
    """'0,25,50,75,100' -> [0.0, 25.0, ...]: needle depths in percent of the filler."""
    try:
        depths = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--retrieval-depths {text!r} must be comma-separated percentages, e.g. 0,25,50,75,100") \
            from None
    bad = [d for d in depths if not 0 <= d <= 100]
    if not depths or bad:
        raise UserError(f"--retrieval-depths {text!r}: every depth is a percentage of the filler from 0 (right after "
                        f"the intro) to 100 (right before the question){'; not ' + str(bad) if bad else ''}")
    return depths
