"""Retrieval prompts (megatron/evaluation/retrieval/prompts.py): exactly the stated token count, the
needle at the stated depth, candidates of the answer's format and token count, a pure function of
their coordinates, and one-line refusals of bad input."""
import re

import numpy as np
import pytest

from megatron.errors import UserError
from megatron.evaluation.retrieval.prompts import TASKS, PromptMaker, SentenceFiller, SplitFiller, parse_depths
from megatron.evaluation.retrieval.summary import effective_length, summarize, wilson_interval
from megatron.tokenizer.char_level import CharLevelTokenizer
from tests.conftest import write_token_dataset


class PairedDigits(CharLevelTokenizer):
    """A tokenizer whose digit runs split into pairs (as BPE splits numbers): values of one format
    take different numbers of tokens, which the candidates must match."""

    def tokenize(self, text: str) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text[i:i + 2].isdigit() and len(text[i:i + 2]) == 2 and int(text[i]) % 2:  # odd first digit: a pair
                out.append(300 + int(text[i:i + 2]))
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    def detokenize(self, ids) -> str:
        return "".join(f"{i - 300:02d}" if i >= 300 else chr(i) for i in ids)


class NoDigits(CharLevelTokenizer):
    def tokenize(self, text: str) -> list[int]:
        return [ord("?") if c.isdigit() else ord(c) for c in text]


def maker(task="passkey", tokenizer=None, filler=None, k=10, seed=3):
    tok = tokenizer or CharLevelTokenizer()
    return PromptMaker(task, tok, filler or SentenceFiller(tok), k, seed)


@pytest.fixture(scope="module")
def split_filler(tmp_path_factory):
    prefix = write_token_dataset(str(tmp_path_factory.mktemp("filler") / "text_document"), num_docs=300)
    return SplitFiller(prefix, "80,10,10", "test")


@pytest.mark.parametrize("task", sorted(TASKS))
@pytest.mark.parametrize("tokenizer", [CharLevelTokenizer(), PairedDigits()], ids=["char", "paired-digits"])
@pytest.mark.parametrize("filler", ["sentences", "split"])
def test_exact_length_needle_at_depth_and_candidates(task, tokenizer, filler, split_filler):
    m = maker(task, tokenizer, split_filler if filler == "split" else SentenceFiller(tokenizer))
    intro = len(tokenizer.tokenize(TASKS[task].intro))
    for length in (400, 512, 1000):
        for depth in (0, 10, 33.3, 50, 100):
            p = m.make(length, depth, 0)
            assert len(p.tokens) == length
            needle = tokenizer.tokenize(TASKS[task].needle.format(key=p.key, value=p.answer_text.strip()))
            assert p.tokens[p.needle_at:p.needle_at + len(needle)] == needle
            question = tokenizer.tokenize(TASKS[task].question.format(key=p.key))
            assert p.tokens[-len(question):] == question
            assert p.filler_before == round(depth / 100 * p.filler_total)
            if not p.distractor_keys:  # alone in the filler: the rest of the prompt is filler
                assert p.filler_total == length - intro - len(question) - len(needle)
                assert p.needle_at == intro + p.filler_before
            # K distinct candidates of the answer's format and token count, the answer among them
            assert len(p.candidates) == 10 and len(set(p.candidate_texts)) == 10
            assert all(len(c) == len(p.answer_tokens) for c in p.candidates)
            assert all(c.startswith(" ") and c[1:].isdigit() and len(c) == TASKS[task].digits + 1
                       for c in p.candidate_texts)
            assert tokenizer.tokenize(p.answer_text) == p.answer_tokens


def test_key_value_candidates_start_with_the_distractors_values():
    m = maker("kv")
    p = m.make(600, 50, 4)
    assert len(p.distractor_keys) == TASKS["kv"].distractors and p.key not in p.distractor_keys
    text = CharLevelTokenizer().detokenize(p.tokens)
    for key in p.distractor_keys:  # every distractor's value is a wrong candidate (the hardest ones)
        value = text.split(f"for {key} is ")[1].split(".")[0]
        assert f" {value}" in p.candidate_texts and f" {value}" != p.answer_text


def test_prompts_are_a_pure_function_of_their_coordinates(split_filler):
    a, b = maker(filler=split_filler), maker(filler=split_filler)
    for coords in [(512, 0, 0), (512, 50, 1), (1000, 100, 7)]:
        b.make(700, 25, 3)  # other prompts made in between change nothing
        assert a.make(*coords) == b.make(*coords)
    assert a.make(512, 50, 0).answer_text != a.make(512, 50, 1).answer_text
    assert a.make(512, 50, 0).tokens != maker(filler=split_filler, seed=4).make(512, 50, 0).tokens


def test_the_control_has_no_needle_and_the_same_length():
    m = maker()
    p, control = m.make(512, 50, 2), m.make(512, 50, 2, with_needle=False)
    assert len(control.tokens) == 512 and control.answer_text == p.answer_text
    assert p.answer_text.strip() not in CharLevelTokenizer().detokenize(control.tokens)
    assert p.answer_text.strip() in CharLevelTokenizer().detokenize(p.tokens)


@pytest.mark.parametrize("make, message", [
    (lambda: parse_depths("0,50,150"), "from 0 (right after the intro) to 100"),
    (lambda: parse_depths("0,x"), "comma-separated percentages"),
    (lambda: maker(k=1), "at least 2 candidates"),
    (lambda: maker("needle"), "not one of passkey, kv"),
    (lambda: maker(tokenizer=NoDigits()), "cannot spell the passkey task's text"),
    (lambda: maker().make(60, 50, 0), "length 60 is too short for a passkey prompt"),
])
def test_bad_input_is_refused_in_one_line(make, message):
    with pytest.raises(UserError, match=re.escape(message)) as e:
        make()
    assert "\n" not in str(e.value)


def test_a_split_too_small_for_the_filler_is_refused(tmp_path):
    small = SplitFiller(write_token_dataset(str(tmp_path / "small"), num_docs=20), "80,10,10", "test")
    with pytest.raises(UserError, match="fewer than the [0-9]+ filler tokens one prompt needs"):
        maker(filler=small).make(4000, 50, 0)


def test_wilson_interval_and_effective_length():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)  # textbook values
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert effective_length({128: 0.9, 256: 0.85, 512: 0.5, 1024: 0.9}, 0.8) == 256  # 1024 comes after a miss
    assert effective_length({128: 0.5, 256: 0.9}, 0.8) is None


def test_summary_counts_each_cell():
    rows = [{"length": L, "depth": d, "correct": (i + d / 25) % 2 == 0, "exact_match": False}
            for L in (128, 256) for d in (0, 50) for i in range(4)]
    s = summarize(rows, [128, 256], [0, 50], 5, 0.5, generated=True)
    cells = {(c["length"], c["depth"]): c for c in s["cells"]}
    assert cells[(128, 0)]["choice"]["n"] == 4 and cells[(128, 0)]["choice"]["correct"] == 2
    assert s["by_length"]["256"]["choice"]["accuracy"] == 0.5 and s["chance"] == 0.2
    assert s["effective_length"] == {"choice": 256, "exact_match": None}
    assert np.isclose(s["by_length"]["128"]["exact_match"]["accuracy"], 0.0)
