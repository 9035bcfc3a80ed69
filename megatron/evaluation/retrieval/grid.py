"""The retrieval grid of one checkpoint: every task x length x depth x prompt index, spread over
the ranks of a launch like the perplexity sweep, merged into one eval.json section per task and one
samples file per task (every prompt, its candidates, the answer, the scores), the same as one
process's: prompts are a pure function of their coordinates (prompts.py), so a rank count changes
only who scores which prompt.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from megatron.errors import UserError
from megatron.evaluation.retrieval.prompts import FILLERS, TASKS, PromptMaker, SentenceFiller, SplitFiller
from megatron.evaluation.retrieval.summary import summarize
from megatron.evaluation.spread import ONE_PROCESS, EvalGroup

SCORINGS = ("choice", "generate", "both")


@dataclass(frozen=True)
class RetrievalSpec:
    tasks: tuple[str, ...]
    depths: tuple[float, ...]
    prompts: int  # per length x depth cell
    candidates: int
    filler: str  # FILLERS
    scoring: str  # SCORINGS: multiple choice always; greedy generation too unless "choice"
    threshold: float
    seed: int
    batch_size: int = 1

    def check(self) -> None:
        """The flags' own problems, before any checkpoint is loaded."""
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise UserError(f"--retrieval {','.join(unknown)}: not a retrieval task; the tasks are "
                            f"{', '.join(TASKS)}")
        if self.candidates < 2:
            raise UserError(f"--retrieval-candidates {self.candidates}: multiple choice needs at least 2 candidates")
        if self.filler not in FILLERS:
            raise UserError(f"--retrieval-filler {self.filler!r}: one of {', '.join(FILLERS)}")
        if not 0 < self.threshold <= 1:
            raise UserError(f"--retrieval-threshold {self.threshold}: an accuracy in (0, 1]")

    @property
    def generates(self) -> bool:
        return self.scoring != "choice"


def prompt_maker(spec: RetrievalSpec, task: str, tokenizer, data: tuple[str, str, str]) -> PromptMaker:
    """data: (prefix, split string, split name) of the evaluation split (the `split` filler's source)."""
    filler = SplitFiller(*data) if spec.filler == "split" else SentenceFiller(tokenizer)
    return PromptMaker(task, tokenizer, filler, spec.candidates, spec.seed)


def check_lengths(spec: RetrievalSpec, makers: dict, lengths: list[int], model, device) -> None:
    """Refuse, before any work, a length too short for a task's text or past what memory holds: the
    prompt's kv-cache, forked once per candidate, for a batch of prompts."""
    from megatron.generation import PEAK_FACTOR, available_bytes, kv_cache_bytes_per_token  # lazy: torch
    from megatron.model.size import human_bytes

    for task, maker in makers.items():
        short = [L for L in lengths if L < maker.fixed_tokens(L) + 16]
        if short:
            raise UserError(f"retrieval task {task}: lengths {short} are too short for its text (about "
                            f"{maker.fixed_tokens(short[0])} tokens without filler); drop them from --lengths")
    per_token = kv_cache_bytes_per_token(model, device) * PEAK_FACTOR * spec.batch_size * (1 + spec.candidates)
    free, longest = available_bytes(device), max(lengths)
    if longest * per_token > free:
        fit = free // per_token
        raise UserError(f"retrieval at length {longest}: a batch of {spec.batch_size} prompts with "
                        f"{spec.candidates} candidates each needs {human_bytes(longest * per_token)} of kv-cache on "
                        f"{device}, more than the {human_bytes(free)} available (lengths up to {fit} fit): drop the "
                        "longer lengths, or lower --batch-size or --retrieval-candidates")


def sample_row(prompt, scored, tokenizer) -> dict:
    """One samples-file row: enough to re-score the same prompt with another tool."""
    right = scored.choice == prompt.answer_index
    row = {"task": prompt.task, "length": prompt.length, "depth": prompt.depth, "index": prompt.index,
           "needle_at": prompt.needle_at, "filler_before": prompt.filler_before, "filler_total": prompt.filler_total,
           "key": prompt.key, "answer": prompt.answer_text,
           "answer_index": prompt.answer_index, "candidates": prompt.candidate_texts,
           "logprobs": [round(x, 6) for x in scored.logprobs], "choice": scored.choice, "correct": right}
    if scored.generated is not None:
        text = tokenizer.detokenize(scored.generated)
        row.update(generated=text, exact_match=text.strip() == prompt.answer_text.strip())
    row.update(prompt=tokenizer.detokenize(prompt.tokens), prompt_tokens=prompt.tokens)
    return row


def _score_part(model, maker, spec, length: int, items: list, device, tokenizer) -> list[dict]:
    from megatron.evaluation.retrieval.scoring import score_prompts  # lazy: torch

    rows = []
    for start in range(0, len(items), spec.batch_size):
        prompts = [maker.make(length, depth, index) for depth, index in items[start:start + spec.batch_size]]
        for p, scored in zip(prompts, score_prompts(model, prompts, device, spec.generates)):
            rows.append(sample_row(p, scored, tokenizer))
    return rows


def run_task(model, tokenizer, maker, spec: RetrievalSpec, lengths: list[int], device,
             group: EvalGroup = ONE_PROCESS, say=None) -> tuple[dict, list[dict]]:
    """(eval.json section, sample rows in grid order) of one task; `say(line)` on rank 0 per length."""
    samples = []
    for length in lengths:
        start = time.perf_counter()
        items = [(d, i) for d in spec.depths for i in range(spec.prompts)]
        mine = [items[i] for i in group.part(len(items))]
        parts = group.gather(_score_part, model, maker, spec, length, mine, device, tokenizer)
        rows = [r for part in parts for r in part]
        samples += rows
        if say is not None and group.is_rank0:
            right = sum(r["correct"] for r in rows)
            exact = (f", greedy exact match {sum(r['exact_match'] for r in rows)}/{len(rows)}"
                     if spec.generates else "")
            say(f"retrieval {maker.name} length {length:>6}: multiple choice {right}/{len(rows)} "
                f"(chance 1/{spec.candidates}){exact} ({time.perf_counter() - start:.1f}s)")
    section = summarize(samples, lengths, list(spec.depths), spec.candidates, spec.threshold, spec.generates)
    section.update(filler=spec.filler, prompts_per_cell=spec.prompts, seed=spec.seed)
    return section, samples
