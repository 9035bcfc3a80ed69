"""Aggregation of synthetic eval.json files: Table 3 cell by cell, daggers, CSV, speed, plots, errors."""
import csv
import json
import os
import subprocess
import sys

import pytest

from study.aggregate import table3_cells, write_report
from study.results import load_results
from tests.conftest import ROOT

SCHEMES = ("kerple_log", "alibi", "rotary")
DATASETS = ("code", "web")
SEEDS = (1, 2, 3)
LENGTHS = (512, 1024)
# ppl[(scheme, dataset)] = per-seed values at length 512; length 1024 adds `GROWTH[scheme]` to each.
BASE = {
    ("kerple_log", "code"): (10.0, 11.0, 12.0), ("kerple_log", "web"): (20.0, 21.0, 22.0),
    ("alibi", "code"): (11.0, 12.5, 13.0),  # d = ref - alibi = (-1, -1.5, -1): t = -7, p = 0.0198 -> dagger
    ("alibi", "web"): (20.5, 20.8, 22.9),  # d = (-0.5, 0.2, -0.9): p = 0.339 -> no dagger
    ("rotary", "code"): (9.0, 10.0, 11.0),  # constant shift: degenerate test -> no mark
    ("rotary", "web"): (19.0, 20.5, 21.0),  # reference WORSE, raw p = 0.038, and after Holm over the row's 2
}
GROWTH = {"kerple_log": 0.0, "alibi": 0.0, "rotary": 50.0}  # rotary at 1024 (+50 + seed): ref much better


def ppl_of(scheme, dataset, seed, length):
    v = BASE[(scheme, dataset)][SEEDS.index(seed)]
    return v + (GROWTH[scheme] + (seed if GROWTH[scheme] else 0) if length == 1024 else 0.0)


def write_eval(path, scheme, dataset, seed, meta=True, speed=None, window=None):
    rec = {"schema": "kerple-eval/1", "checkpoint": "x", "iteration": 10, "pos_emb": scheme, "train_length": 512,
           "split": "test", "window": window, "data_path": f"data/{dataset}/{dataset}_text_document",
           "lengths": list(LENGTHS), "results": [], "perplexity": {}, "positionwise": {}}
    for L in LENGTHS:
        p = ppl_of(scheme, dataset, seed, L)
        rec["results"].append({"length": L, "loss": 0.0, "ppl": p, "windows": 1, "tokens": L, "seconds": 0.1})
        rec["perplexity"][str(L)] = p
        rec["positionwise"][str(L)] = {"bin_size": L // 64, "loss": [2.0 + 0.01 * i for i in range(64)]}
    if meta:
        rec.update(seed=seed, dataset=dataset)
    if speed is not None:
        rec["train_speed"] = {"sec_per_step": speed}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(rec, f)
    return str(path)


@pytest.fixture
def results_dir(tmp_path):
    for s in SCHEMES:
        for d in DATASETS:
            for seed in SEEDS:
                speed = {"kerple_log": 0.5, "alibi": 0.4, "rotary": 0.45}[s] + 0.01 * seed if d == "code" else None
                write_eval(tmp_path / "runs" / d / f"{s}_s{seed}" / "eval" / "eval.json", s, d, seed, speed=speed)
    return tmp_path / "runs"


def table_rows(md: str) -> dict[str, list[str]]:
    rows = {}
    for line in md.splitlines():
        if line.startswith("| ") and not line.startswith("| scheme"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = rows.get(cells[0], []) + cells[1:]  # one table per dataset, in order
    return rows


def test_table3_cells_and_daggers(results_dir, tmp_path):
    runs = load_results([str(results_dir)])
    assert len(runs) == 18
    out = tmp_path / "report"
    paths = write_report(runs, str(out), log=lambda *_: None)
    md = (out / "table3.md").read_text()
    assert "## code, train length 512\n\n| scheme | code 512 | code 1024 |\n" in md  # one table per domain
    assert "## web, train length 512\n\n| scheme | web 512 | web 1024 |\n" in md
    rows = table_rows(md)
    assert list(rows) == ["kerple_log", "alibi", "rotary"]  # reference first
    assert rows["kerple_log"] == ["11.00 ± 1.00", "11.00 ± 1.00", "21.00 ± 1.00", "21.00 ± 1.00"]
    assert rows["alibi"] == ["12.17 ± 1.04†", "12.17 ± 1.04†", "21.40 ± 1.31", "21.40 ± 1.31"]
    # rotary 1024 = base + 50 + seed: code (60, 62, 64), d = (-50, -51, -52); web (70, 72.5, 74)
    assert rows["rotary"][0] == "10.00 ± 1.00"  # constant shift of -1: degenerate test, no mark
    assert rows["rotary"][1] == "62.00 ± 2.00†"
    # raw p = 1 - 5 / sqrt(27) = 0.038, the larger of its row's 2 tests: Holm p = max(2 x tiny, 1 x 0.038)
    assert rows["rotary"][2] == "20.17 ± 1.04‡"
    assert rows["rotary"][3] == "72.17 ± 2.02†"
    assert "† = the reference scheme `kerple_log` has significantly lower perplexity" in md
    assert "paired two-sided t-test" in md and "Holm-Bonferroni" in md and ", 2 tests;" in md
    assert "‡ = this scheme has significantly lower perplexity than `kerple_log`" in md
    for name in ("ppl_vs_length_code_L512.png", "ppl_vs_length_web_L512.png", "positionwise_code_L512.png",
                 "positionwise_web_L512.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and 1000 < len(data) < 150_000, name
        assert paths[name] == str(out / name)


def test_table3_csv_and_p_values(results_dir, tmp_path):
    out = tmp_path / "report"
    write_report(load_results([str(results_dir / "**" / "eval.json")]), str(out), log=lambda *_: None)
    with open(out / "table3.csv") as f:
        rows = {(r["dataset"], r["length"], r["scheme"]): r for r in csv.DictReader(f)}
    assert len(rows) == 12
    alibi = rows[("code", "512", "alibi")]
    assert alibi["dagger"] == "1" and float(alibi["p_value"]) == pytest.approx(1 - 7 / 51 ** 0.5, rel=1e-5)
    assert alibi["seeds"] == "1 2 3" and alibi["n_seeds"] == "3" and float(alibi["mean_ppl"]) == pytest.approx(73 / 6)
    assert rows[("web", "512", "alibi")]["dagger"] == "0"
    assert alibi["better_than_reference"] == "0"
    assert float(alibi["p_holm"]) == pytest.approx(2 * float(alibi["p_value"]), rel=1e-5)  # a row of 2 equal p
    assert alibi["family_tests"] == "2" and float(alibi["p_exact_sign_flip"]) == pytest.approx(0.25)  # floor, n = 3
    rotary = rows[("web", "512", "rotary")]
    raw = 1 - 5 / 27 ** 0.5  # d = (1, 0.5, 1): t = 5 with 2 degrees of freedom
    assert float(rotary["p_value"]) == pytest.approx(raw, rel=1e-5) and raw < 0.05
    assert float(rotary["p_holm"]) == pytest.approx(raw, rel=1e-5) and rotary["family_tests"] == "2"
    assert rotary["dagger"] == "0" and rotary["better_than_reference"] == "1"
    assert rows[("code", "1024", "rotary")]["family_tests"] == "1"  # its 512 test is degenerate: a family of one
    assert rows[("code", "512", "kerple_log")]["note"] == "reference"


def test_speed_table(results_dir, tmp_path):
    out = tmp_path / "report"
    write_report(load_results([str(results_dir)]), str(out), log=lambda *_: None)
    rows = table_rows((out / "speed.md").read_text())
    assert rows["kerple_log"] == ["0.520 ± 0.010"] and rows["alibi"] == ["0.420 ± 0.010"]
    assert "| scheme | code, train length 512 |" in (out / "speed.md").read_text()  # web runs have no speed data


def test_speed_from_file_and_no_speed(tmp_path):
    for seed in (1, 2):
        write_eval(tmp_path / "r" / f"k{seed}" / "eval.json", "kerple_log", "web", seed)
    out = tmp_path / "o"
    write_report(load_results([str(tmp_path / "r")]), str(out), log=lambda *_: None)
    assert "No speed data" in (out / "speed.md").read_text()
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"kerple_log/web/1": 0.3, str(tmp_path / "r" / "k2"): 0.5}))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "aggregate_results.py"), str(tmp_path / "r"),
                           "--out", str(out), "--speed", str(speed)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert table_rows((out / "speed.md").read_text())["kerple_log"] == ["0.400 ± 0.141"]
    # only one scheme: kerple_log is the reference, single seed pairs are not needed
    assert table_rows((out / "table3.md").read_text())["kerple_log"][0].startswith("20.50 ± 0.71")


def test_meta_from_path_and_windowed_baseline(tmp_path):
    for scheme in ("kerple_log", "alibi"):
        for seed in (1, 2):
            write_eval(tmp_path / "runs" / f"code-{scheme}-{seed}" / "eval.json", scheme, "code", seed, meta=False)
    write_eval(tmp_path / "runs" / "code-rotary-1" / "eval.json", "rotary", "code", 1, meta=False, window=512)
    runs = load_results([str(tmp_path / "runs")], r"runs/(?P<dataset>[a-z]+)-[a-z_]+-(?P<seed>\d+)/")
    assert sorted(r.key[:3] for r in runs) == [
        ("alibi", "code", 1), ("alibi", "code", 2), ("kerple_log", "code", 1), ("kerple_log", "code", 2),
        ("rotary (window 512)", "code", 1)]
    cells = {(c["scheme"], c["length"]): c for c in table3_cells(runs)}
    assert "1 paired seed(s)" in cells[("rotary (window 512)", 512)]["note"]
    paths = write_report(runs, str(tmp_path / "o"), log=lambda *_: None)
    assert os.path.getsize(paths["positionwise_code_L512.png"]) > 1000
    assert "Untested cells: no test: 1 paired seed(s)" in (tmp_path / "o" / "table3.md").read_text()


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="no result files matched"):
        load_results([str(tmp_path / "nothing" / "*.json")])
    bad = tmp_path / "bad" / "eval.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"schema": "other/1"}))
    with pytest.raises(ValueError, match=r"bad/eval.json: not a kerple-eval/1 result \(schema 'other/1'\)"):
        load_results([str(bad)])
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad/eval.json: not a readable JSON file"):
        load_results([str(bad)])
    a = write_eval(tmp_path / "a" / "eval.json", "alibi", "web", 1)
    b = write_eval(tmp_path / "b" / "eval.json", "alibi", "web", 1)
    with pytest.raises(ValueError, match="two result files for scheme='alibi' dataset='web' seed=1") as e:
        load_results([a, b])
    assert a in str(e.value) and b in str(e.value)
    assert len(load_results([a, a])) == 1  # the same file twice is not a conflict
    with pytest.raises(ValueError, match="not a valid regex"):
        load_results([a], "(?P<seed")


def test_cli_error_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "aggregate_results.py"), str(tmp_path / "x*.json"),
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and "no result files matched" in proc.stderr


def test_table3_says_which_windows_and_flags_short_lengths(tmp_path):
    for seed in (1, 2):
        path = write_eval(tmp_path / "r" / f"k{seed}" / "eval.json", "kerple_log", "web", seed)
        rec = json.loads(open(path).read())
        rec.update(window_order="shuffled", data_seed=seed)
        for r in rec["results"]:
            r["windows_requested"] = 320
            r["windows"] = 320 if r["length"] == 512 else 40
        with open(path, "w") as f:
            json.dump(rec, f)
    out = tmp_path / "o"
    write_report(load_results([str(tmp_path / "r")]), str(out), log=lambda *_: None)
    text = (out / "table3.md").read_text()
    assert "Windows: shuffled (NeoX's shuffled sample order), data seed 1, 2." in text
    assert "Fewer windows than asked: web, train length 512, length 1024: 40 of 320 (all 2 results)." in text
    assert "Windows scored per length: 512: 320, 1024: 40." in text
    assert "web 512 kerple_log" not in text


def test_a_nonfinite_perplexity_is_refused_not_averaged(results_dir):
    """Issue 23: a NaN ppl (an evaluation from before evaluate.py refused NaN losses) made its cell
    'nan ± nan' silently; the record is now refused, naming the file and the lengths."""
    path = results_dir / "code" / "alibi_s2" / "eval" / "eval.json"
    rec = json.loads(path.read_text())
    rec["results"][1]["ppl"] = float("nan")
    path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=rf"{path}: perplexity at lengths \[1024\] is not finite \(nan\).*evaluate\.py"):
        load_results([str(results_dir)])


def test_a_test_on_fewer_seeds_shows_the_reference_mean_over_the_paired_seeds(tmp_path):
    """kerple_log on 5 seeds, alibi on 3: the table shows kerple_log's mean over seeds 1-3 next to
    alibi's test, and the CSV carries it."""
    for seed, ref in zip((1, 2, 3, 4, 5), (10.0, 11.0, 12.0, 30.0, 40.0)):
        path = write_eval(tmp_path / "r" / f"k{seed}" / "eval.json", "kerple_log", "code", min(seed, 3))
        rec = json.loads(open(path).read())
        rec["seed"] = seed
        for r in rec["results"]:
            r["ppl"] = ref
        with open(path, "w") as f:
            json.dump(rec, f)
        if seed <= 3:
            write_eval(tmp_path / "r" / f"a{seed}" / "eval.json", "alibi", "code", seed)
    out = tmp_path / "o"
    write_report(load_results([str(tmp_path / "r")]), str(out), log=lambda *_: None)
    rows = table_rows((out / "table3.md").read_text())
    assert rows["kerple_log"] == ["20.60 ± 13.63", "20.60 ± 13.63"]  # all five seeds
    assert rows["kerple_log, mean of seeds 1, 2, 3"] == ["11.00", "11.00"]  # the three alibi was paired with
    assert list(rows) == ["kerple_log", "kerple_log, mean of seeds 1, 2, 3", "alibi"]
    with open(out / "table3.csv") as f:
        alibi = next(r for r in csv.DictReader(f) if r["scheme"] == "alibi")
    assert float(alibi["reference_mean_paired_seeds"]) == pytest.approx(11.0) and alibi["paired_seeds"] == "1 2 3"
    assert alibi["train_length"] == "512"


def test_two_train_lengths_are_two_groups(tmp_path):
    for L in (512, 1024):
        for seed in (1, 2):
            path = write_eval(tmp_path / "r" / f"L{L}_{seed}" / "eval.json", "kerple_log", "code", seed)
            rec = json.loads(open(path).read())
            rec["train_length"] = L
            with open(path, "w") as f:
                json.dump(rec, f)
    runs = load_results([str(tmp_path / "r")])
    assert len(runs) == 4  # the same scheme, dataset and seed at two lengths is not a conflict
    paths = write_report(runs, str(tmp_path / "o"), log=lambda *_: None)
    md = (tmp_path / "o" / "table3.md").read_text()
    assert "## code, train length 512\n" in md and "## code, train length 1024\n" in md
    assert {"ppl_vs_length_code_L512.png", "ppl_vs_length_code_L1024.png"} <= set(paths)
