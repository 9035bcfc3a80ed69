"""tools/compare_runs.py, what make quickstart ends with: kerple against rotary as a table and a
figure when both runs exist; the exact commands to get there when one does not (issue 45, item 6)."""
import os
import re
import subprocess
import sys

from study import compare_runs
from tests.conftest import ROOT
from tests.unit.test_single_run_plots import QUICKSTART, fake_eval_json

ROTARY = {128: 127.222, 256: 129.54, 512: 137.78, 1024: 150.35, 2048: 168.002}


def make_run(root, name, ppl, pos_emb):
    os.makedirs(root / name / "eval")
    fake_eval_json(root / name / "eval" / "eval.json", ppl, pos_emb, checkpoint=str(root / name / "checkpoints"))
    return str(root / name)


def test_both_runs_give_a_table_and_a_figure(tmp_path, capsys, monkeypatch):
    from megatron.evaluation import plots

    figures = []
    save = plots.save_figure
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.append(fig) or save(fig, path))
    kerple = make_run(tmp_path, "quickstart", QUICKSTART, "kerple_log")
    rotary = make_run(tmp_path, "quickstart_rotary", ROTARY, "rotary")
    assert compare_runs.main([kerple, rotary, "--out", str(tmp_path / "compare")]) == 0
    out = capsys.readouterr().out
    table = (tmp_path / "compare" / "compare.md").read_text()
    assert "| length | quickstart (kerple_log) | change | quickstart_rotary (rotary) | change |" in table
    assert "| 2048 | 124.266 | +1.4% | 168.002 | +32.1% |" in table and table.split("\n", 2)[2] in out
    assert "Every run scored the same windows at each length." in table
    assert (tmp_path / "compare" / "compare.png").is_file()
    ax = figures[0].axes[0]
    assert {line.get_label() for line in ax.get_lines()} >= {"quickstart (kerple_log)", "quickstart_rotary (rotary)"}
    lo, hi = ax.get_ylim()
    assert hi / lo >= plots.PPL_MIN_SPAN and ax.get_xscale() == "log"
    assert {"+1.4% (16x vs 1x)", "+32.1% (16x vs 1x)"} <= {t.get_text() for t in ax.texts}
    plots.plt.close("all")


def test_runs_on_other_windows_are_flagged(tmp_path):
    kerple = make_run(tmp_path, "a", QUICKSTART, "kerple_log")
    rotary = make_run(tmp_path, "b", ROTARY, "rotary")
    path = os.path.join(rotary, "eval", "eval.json")
    text = open(path).read().replace('"data_seed": 1234', '"data_seed": 7')
    open(path, "w").write(text)
    compare_runs.main([kerple, rotary, "--out", str(tmp_path / "c")])
    assert "Not comparable at lengths 128, 256, 512, 1024, 2048" in (tmp_path / "c" / "compare.md").read_text()


def test_a_missing_rotary_run_prints_the_commands_and_writes_nothing(tmp_path):
    kerple = make_run(tmp_path, "quickstart", QUICKSTART, "kerple_log")
    missing, out = str(tmp_path / "quickstart_rotary"), str(tmp_path / "compare")
    argv = [sys.executable, "tools/compare_runs.py", kerple, missing, "--out", out]
    ok = subprocess.run([*argv, "--missing-ok", "--missing-hint", "make quickstart-rotary"], cwd=ROOT,
                        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert ok.returncode == 0, ok.stderr
    assert (f"{missing}/eval/eval.json does not exist. To compare, run make quickstart-rotary, then: "
            f"python tools/compare_runs.py {kerple} {missing} --out {out}") in ok.stdout
    refused = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert refused.returncode == 2 and "does not exist" in refused.stderr and "Traceback" not in refused.stderr
    assert not os.path.exists(out)


def test_make_quickstart_ends_with_the_comparison():
    makefile = open(os.path.join(ROOT, "Makefile")).read()
    for target, hint in (("quickstart:", "make quickstart-rotary"), ("quickstart-rotary:", "make quickstart")):
        recipe = makefile.split("\n" + target, 1)[1].split("\n\n", 1)[0]
        lines = [x.strip() for x in recipe.replace("\\\n", " ").splitlines()[1:]]
        assert "tools/check_figures.py" in lines[-2]  # kept, and the comparison after it
        assert lines[-1].split() == ["$(PY)", "tools/compare_runs.py", "runs/quickstart", "runs/quickstart_rotary",
                                     "--out", "runs/compare", "--missing-ok", "--missing-hint", *f'"{hint}"'.split()]


def test_equal_text_and_retrieval_are_shown_side_by_side(tmp_path):
    import json

    from megatron.evaluation.retrieval.summary import summarize

    kerple = make_run(tmp_path, "a", QUICKSTART, "kerple_log")
    rotary = make_run(tmp_path, "b", ROTARY, "rotary")
    path = os.path.join(kerple, "eval", "eval.json")
    rec = json.loads(open(path).read())
    rec["equal_text"] = {"spans": 4, "scored_tokens_per_span": 128, "128": {"ppl": 130.5}, "2048": {"ppl": 120.25}}
    rows = [{"length": L, "depth": 50.0, "correct": i < (4 if L == 128 else 1), "exact_match": False}
            for L in (128, 2048) for i in range(5)]
    rec["retrieval"] = {"passkey": summarize(rows, [128, 2048], [50.0], 10, 0.8, generated=False)}
    open(path, "w").write(json.dumps(rec))
    compare_runs.main([kerple, rotary, "--out", str(tmp_path / "c")])
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| 2048 | 120.250 | - |" in table  # rotary has no equal-text figures
    assert "| 128 | 80% (38-96) | - |" in table and "| 2048 | 20% (4-62) | - |" in table
    assert "| effective length | 128 | - |" in table


def test_a_malformed_eval_json_is_named_with_its_key(tmp_path):
    """Issue 54 item 6: a string where an object belongs, an empty results list, a length that is not a
    number: one message naming the file and the key, no traceback."""
    import json

    import pytest

    from megatron.errors import UserError

    kerple = make_run(tmp_path, "a", QUICKSTART, "kerple_log")
    path = os.path.join(make_run(tmp_path, "b", ROTARY, "rotary"), "eval", "eval.json")
    good = json.loads(open(path).read())
    for change, said in [({"results": "abc"}, "results = 'abc': must be a list"),
                         ({"results": []}, "results = []: holds no length"),
                         ({"results": [dict(good["results"][0], length="abc")]}, "results[0].length = 'abc'"),
                         ({"results": [dict(good["results"][0], ppl=None)]}, "results[0].ppl = None: must be a number"),
                         ({"positionwise": {"128": "x"}}, "positionwise['128'] = 'x'")]:
        open(path, "w").write(json.dumps({**good, **change}))
        with pytest.raises(UserError, match=re.escape(f"{path}: {said}")):
            compare_runs.main([kerple, os.path.dirname(os.path.dirname(path)), "--out", str(tmp_path / "c")])
