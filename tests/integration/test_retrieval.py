"""Retrieval at length through evaluate.py (megatron/evaluation/retrieval/): the shared-forward
likelihood scorer against a direct full-sequence computation, greedy generation with the kv-cache
against generation without it, a control without the needle at chance, eval.json's section and the
samples file, two ranks equal to one process, and refusals before any work."""
import json
import os

import pytest
import torch

from megatron.checkpoint.load_model import load_checkpoint_model
from megatron.errors import UserError
from megatron.evaluation import sweep as evaluate
from megatron.evaluation.retrieval.grid import RetrievalSpec, check_lengths
from megatron.evaluation.retrieval.prompts import PromptMaker, SentenceFiller
from megatron.evaluation.retrieval.scoring import score_prompts
from megatron.evaluation.retrieval.summary import wilson_interval
from megatron.tokenizer.char_level import CharLevelTokenizer
from tests.integration.test_evaluate_ranks import checkpoint, two_ranks  # noqa: F401 - the module's fixture

FLAGS = ["--lengths", "400,600", "--max-windows", "2", "--retrieval", "passkey,kv", "--retrieval-prompts", "3",
         "--retrieval-depths", "0,50,100", "--quiet", "--no-plots"]


@pytest.fixture(scope="module")
def model(checkpoint):  # noqa: F811 - pytest's fixture by name
    return load_checkpoint_model(checkpoint[0])[0]


def full_logprob(model, tokens: list[int], continuation: list[int]) -> float:
    """log p(continuation | tokens) from one forward over the whole sequence, no cache."""
    seq = torch.tensor([tokens + continuation])
    with torch.no_grad():
        logp = torch.log_softmax(model(seq).float(), -1)[0]
    n = len(tokens)
    return sum(float(logp[n - 1 + j, t]) for j, t in enumerate(continuation))


def greedy_without_cache(model, tokens: list[int], n: int) -> list[int]:
    out = list(tokens)
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([out]))[0, -1].argmax()))
    return out[len(tokens):]


@pytest.mark.parametrize("task", ["passkey", "kv"])
def test_shared_forward_scores_equal_full_sequences_and_cached_generation_equals_uncached(model, task):
    tok = CharLevelTokenizer()
    maker = PromptMaker(task, tok, SentenceFiller(tok), 4, seed=5)
    prompts = [maker.make(400, depth, i) for i, depth in enumerate((0, 50, 100))]
    scored = score_prompts(model, prompts, "cpu", generate=True)  # one batch: 3 prompts x 4 candidates
    for p, s in zip(prompts, scored):
        direct = [full_logprob(model, p.tokens, c) for c in p.candidates]
        assert s.logprobs == pytest.approx(direct, rel=1e-5, abs=1e-5)
        assert s.choice == max(range(4), key=direct.__getitem__)
        assert s.generated == greedy_without_cache(model, p.tokens, len(p.answer_tokens))


def test_without_the_needle_the_model_scores_chance(model):
    """Nothing in the control names the answer, and the answer is a uniformly drawn candidate: any
    model's accuracy is 1/K, within its interval."""
    tok = CharLevelTokenizer()
    maker = PromptMaker("passkey", tok, SentenceFiller(tok), 4, seed=11)
    prompts = [maker.make(300, 50, i, with_needle=False) for i in range(160)]
    right = sum(s.choice == p.answer_index
                for i in range(0, len(prompts), 16)
                for p, s in zip(prompts[i:i + 16], score_prompts(model, prompts[i:i + 16], "cpu", generate=False)))
    lo, hi = wilson_interval(right, len(prompts))
    assert lo <= 0.25 <= hi, (right, lo, hi)


def test_eval_json_section_samples_file_and_heatmap(checkpoint, tmp_path):  # noqa: F811
    out = tmp_path / "eval"
    assert evaluate.main(["--checkpoint", checkpoint[0], "--out", str(out), *FLAGS[:-1], "--plots"]) == 0
    rec = json.loads((out / "eval.json").read_text())
    assert set(rec["perplexity"]) == {"400", "600"}  # perplexity at the same lengths, as before
    for task in ("passkey", "kv"):
        section = rec["retrieval"][task]
        assert section["lengths"] == [400, 600] and section["depths"] == [0.0, 50.0, 100.0]
        assert section["chance"] == 0.1 and section["scorings"] == ["choice", "exact_match"]
        assert len(section["cells"]) == 6 and all(c["choice"]["n"] == 3 for c in section["cells"])
        assert set(section["effective_length"]) == {"choice", "exact_match"}
        rows = [json.loads(line) for line in (out / section["samples"]).read_text().splitlines()]
        assert len(rows) == 2 * 3 * 3
        for r in rows:  # enough to re-score elsewhere: the prompt's text and ids, the candidates, the scores
            assert len(r["prompt_tokens"]) == r["length"] and r["answer"] == r["candidates"][r["answer_index"]]
            assert r["correct"] == (r["choice"] == r["answer_index"]) and len(r["logprobs"]) == 10
        assert (out / f"retrieval_{task}.png").stat().st_size > 0 and (out / f"retrieval_{task}_exact.png").exists()
    assert "Retrieval `kv`" in (out / "eval.md").read_text()


def test_two_ranks_write_the_retrieval_of_one_process(checkpoint, tmp_path):  # noqa: F811
    one, two = tmp_path / "one", tmp_path / "two"
    assert evaluate.main(["--checkpoint", checkpoint[0], "--out", str(one), *FLAGS]) == 0
    procs = two_ranks(["--checkpoint", checkpoint[0], "--out", str(two), *FLAGS])
    assert all(p.returncode == 0 for p in procs), [p.stderr[-2000:] for p in procs]
    a, b = (json.loads((d / "eval.json").read_text())["retrieval"] for d in (one, two))
    assert a == b
    for task in ("passkey", "kv"):
        assert (one / f"retrieval_{task}.jsonl").read_text() == (two / f"retrieval_{task}.jsonl").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--retrieval-depths", "0,120"], "from 0 (right after the intro) to 100"),
    (["--retrieval-candidates", "1"], "at least 2 candidates"),
    (["--retrieval", "passkey,needle"], "--retrieval needle: not a retrieval task"),
    (["--lengths", "64"], "lengths [64] are too short for its text"),
])
def test_bad_retrieval_input_is_refused_before_any_work(checkpoint, tmp_path, capsys, flags, message):  # noqa: F811
    argv = ["--checkpoint", checkpoint[0], "--out", str(tmp_path / "eval"), "--retrieval", "passkey",
            "--lengths", "400", "--quiet", "--no-plots", *flags]
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        evaluate.main(argv)
    assert "length    400" not in capsys.readouterr().out  # no perplexity length was scored first
    assert not os.path.exists(tmp_path / "eval" / "eval.json")


def test_a_length_past_memory_is_refused_naming_what_fits(model, monkeypatch):
    import megatron.generation as generation

    monkeypatch.setattr(generation, "available_bytes", lambda device: 10 * 2**20)  # 10 MiB free
    tok = CharLevelTokenizer()
    spec = RetrievalSpec(("passkey",), (50.0,), 1, 10, "sentences", "choice", 0.8, 0)
    makers = {"passkey": PromptMaker("passkey", tok, SentenceFiller(tok), 10, 0)}
    with pytest.raises(UserError, match=r"length 100000: .* than the 10.5 MB available \(lengths up to [0-9]+ fit\)"):
        check_lengths(spec, makers, [400, 100000], model, "cpu")
    check_lengths(spec, makers, [400], model, "cpu")  # what fits passes


def test_a_new_retrieval_task_is_one_entry(checkpoint, tmp_path, monkeypatch):  # noqa: F811
    """docs/architecture.md, "An evaluation task": a retrieval task is its words, one TaskText in
    megatron/data/retrieval_text.py's TASKS; evaluate.py --retrieval takes it, and the prompts,
    scoring, grid and summary take it as they are (a throwaway task here)."""
    from megatron.data.retrieval_text import TASKS, TaskText

    monkeypatch.setitem(TASKS, "vault", TaskText(
        intro="A vault code is hidden in the text. Remember it.\n", needle=" The vault code is {value}.",
        question="\nThe vault code is", digits=4, distractors=0, code=99))
    out = tmp_path / "eval"
    flags = ["--lengths", "400", "--max-windows", "1", "--retrieval", "vault", "--retrieval-prompts", "2",
             "--retrieval-depths", "0,100", "--quiet", "--no-plots"]
    assert evaluate.main(["--checkpoint", checkpoint[0], "--out", str(out), *flags]) == 0
    section = json.loads((out / "eval.json").read_text())["retrieval"]["vault"]
    assert section["lengths"] == [400] and len(section["cells"]) == 2
    rows = [json.loads(line) for line in (out / section["samples"]).read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["answer"].strip()) == 4 for r in rows)
