"""The GPU check's plumbing on CPU (issue 32): its steps under one clock, skipped with a line when
the clock runs short, a step interrupted at its timeout still reporting what finished, the
benchmarks' own --time-budget (baselines first), and tools/gpu_results.py folding a results
directory into the docs with each goal judged from the figures."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from benchmarks.budget import TimeBudget
from benchmarks.report import markers
from tests.unit.test_bench_tools import ATTN_TINY, TRAIN_TINY, attn, load_tool, train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
check = load_tool("gpu_check")
results = load_tool("gpu_results")


def test_time_budget_expires_on_its_clock_and_refuses_nonsense():
    now = [100.0]
    budget = TimeBudget(5, clock=lambda: now[0])
    assert not budget.expired()
    now[0] = 105.0
    assert budget.expired() and "--time-budget 5 s" in budget.skip_note()
    assert not TimeBudget(None).expired()
    with pytest.raises(ValueError, match="must be > 0"):
        TimeBudget(0)


def test_attention_measures_baselines_first_then_our_kernel():
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "--backends", "triton", "sdpa", "flex",
                                        "--triton-bias", "both"])
    order = sorted(attn.cases(args), key=attn.priority(args))
    kinds = [0 if c[:2] in attn.BASELINE_ROWS else 1 if c[1] == "triton" else 2 for c in order]
    assert kinds == sorted(kinds) and kinds[0] == 0 and 1 in kinds


def test_attention_out_of_time_skips_every_cell_with_a_line():
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "--backends", "sdpa", "--time-budget", "1e-9"])
    rows, _, text = attn.run(args)
    assert rows and all(r.fwd_s is None and r.fb_s is None for r in rows)
    assert "skipped: out of time (--time-budget 1e-09 s)" in text


def test_attention_time_budget_must_be_positive(capsys):
    with pytest.raises(SystemExit) as e:
        attn.parse_args(ATTN_TINY + ["--time-budget", "0"])
    assert e.value.code == 2 and "--time-budget must be > 0" in capsys.readouterr().err


def test_train_step_runs_the_goal_references_first_and_skips_when_out_of_time():
    key = train.measure_order(["rotary", "alibi", "kerple_log", "none"])
    assert sorted(["rotary", "alibi", "kerple_log", "none"], key=key) == ["rotary", "none", "alibi", "kerple_log"]
    args = train.parse_args(TRAIN_TINY + ["--schemes", "kerple_log", "none", "--time-budget", "1e-9"])
    results_, text = train.run(args)
    assert [r.scheme for r in results_] == ["kerple_log", "none"]  # the table keeps the order asked for
    assert all(r.cell == "skipped" for r in results_) and "out of time" in text


def test_a_step_that_would_not_fit_is_skipped_with_a_line(tmp_path):
    summary = check.run(str(tmp_path), 0.5, tiny=True, python=sys.executable)
    assert [s["status"] for s in summary["steps"]] == ["skipped"] * len(summary["steps"])
    assert all("s left of 0, the step needs at least" in s["why"] for s in summary["steps"])
    saved = json.load(open(tmp_path / "summary.json"))
    assert saved["format"] == "kerple-gpu-check/1" and saved["tiny"] is True


def test_a_step_at_its_timeout_is_interrupted_and_reports(tmp_path, monkeypatch):
    """SIGINT first: a process that handles it (pytest writes its XML then) finishes its report."""
    monkeypatch.setattr(check, "INTERRUPT_GRACE", 5.0)
    script = tmp_path / "slow.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        try:
            print("started", flush=True); time.sleep(60)
        except KeyboardInterrupt:
            open(sys.argv[1], "w").write("report"); sys.exit(2)
    """))
    report = tmp_path / "report.txt"
    step = check.Step("slow", 0, 6, [sys.executable, str(script), str(report)], interrupt=True)
    with open(tmp_path / "log", "w") as log:
        result = check.run_step(step, 6.5, log)
    assert result["status"] == "timed out" and result["rc"] == 2 and report.read_text() == "report"
    assert "slow: timed out (rc 2)" in (tmp_path / "log").read_text()


def test_tiny_check_then_results_fold_into_the_docs(tmp_path):
    """The real command on CPU (two cheap steps), then gpu_results on its directory."""
    out = tmp_path / "out"
    proc = subprocess.run(["sh", "tools/gpu_check.sh", str(out), "--tiny", "--only", "test-gpu", "train",
                           "train-ops-gpu", "train-ops-pipe-gpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable, "GPU_CHECK_NO_BUNDLE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.load(open(out / "summary.json"))
    assert {s["name"]: s["status"] for s in summary["steps"]} == {"test-gpu": "ok", "train": "ok",
                                                                   "train-ops-gpu": "ok", "train-ops-pipe-gpu": "ok"}
    assert (out / "test-gpu.xml").is_file() and (out / "train.md").is_file() and (out / "train-ops-gpu.md").is_file()
    doc, status_page = tmp_path / "benchmarks.md", tmp_path / "status.md"
    doc.write_text("# Benchmarks\n\nhand-written\n")
    status_page.write_text("# Status\n\n<!-- bench:gpu-status:begin -->\nold\n<!-- bench:gpu-status:end -->\n\ntail\n")
    cmd = [sys.executable, "tools/gpu_results.py", str(out), "--doc", str(doc), "--status", str(status_page)]
    refused = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert refused.returncode != 0 and "--tiny run" in refused.stderr and "Traceback" not in refused.stderr
    assert doc.read_text() == "# Benchmarks\n\nhand-written\n"  # nothing written before the refusal
    folded = subprocess.run(cmd + ["--allow-tiny"], cwd=ROOT, capture_output=True, text=True)
    assert folded.returncode == 0, folded.stderr
    text = doc.read_text()
    assert "hand-written" in text and markers("train")[0] in text and markers("gpu-check")[0] in text
    assert "Where a step's time goes" in text  # the train step's --profile table came through
    for section in ("train-ops-gpu", "train-ops-pipe-gpu"):  # two counts from one returned file
        assert markers(section)[0] in text and "kerple_log" in text.split(markers(section)[0])[1]
    assert "make test-gpu: 0 passed, 0 failed, 0 errors" in text  # tests/gpu all skip without CUDA
    status = status_page.read_text()
    assert "old" not in status and "a --tiny run" in status and status.endswith("tail\n")


def attention_section(ratios: dict, name: str = "attention", head_dim: int = 64) -> str:
    """An attention.md as bench_attention writes it, with the given fwd+bwd / fwd ratios per L."""
    head = "| scheme | backend | L | B | fwd ms | fwd TFLOP/s | fwd x base | fwd+bwd ms | fwd+bwd TFLOP/s | " \
           "fwd+bwd x base | peak GiB | note |\n|" + "---|" * 12
    rows = [f"| kerple_log | triton [inline] | {n} | 1 | 1 | 1 | {f:.2f}x | 1 | 1 | "
            + (f"{b:.2f}x" if b is not None else "-") + " | 1 |  |" for n, (b, f) in ratios.items()]
    begin, end = markers(name)
    return (f"{begin}\n- bf16, head dim {head_dim}, 12 heads\n\nAll cells:\n\n{head}\n" + "\n".join(rows)
            + f"\n{end}\n")


def test_attention_goals_are_judged_over_the_goal_lengths_only():
    body = results.section_body_text(attention_section(
        {1024: (0.5, 0.5), 2048: (1.1, 1.2), 16384: (1.0, 1.3), 65536: (None, 0.9)}), "attention")
    goals = {g[0]: g for g in results.attention_goals(body, "hd 64")}
    fb, fwd = goals["KERPLE-log fwd+bwd, hd 64, triton [inline]"], goals["KERPLE-log fwd, hd 64, triton [inline]"]
    assert fb[2] == "1.00x .. 1.10x" and fb[3] == "met"  # L = 1024 is outside the goal's range
    assert fwd[2] == "0.90x .. 1.30x" and fwd[3] == "not met"


def test_test_counts_from_a_log_cut_short():
    verbose = ("[gw1] [ 10%] PASSED tests/unit/a.py::test_x\n[gw0] [ 20%] FAILED tests/unit/b.py::test_y\n"
               "[gw2] [ 30%] ERROR tests/gpu/c.py::test_z\n")
    counts = results.counts_from_log(verbose)
    assert (counts["passed"], counts["failures"], counts["errors"]) == (1, 1, 1) and counts["partial"]
    assert counts["not_passed"] == ["tests/unit/b.py::test_y (failed)", "tests/gpu/c.py::test_z (error)"]
    dots = results.counts_from_log("bringing up nodes...\n\nF..s.E [ 50%]\n....\n")
    assert (dots["passed"], dots["failures"], dots["errors"], dots["skipped"]) == (7, 1, 1, 1)
    assert results.counts_from_log("nothing ran\n") is None


def test_results_refuse_a_directory_without_a_summary(tmp_path):
    proc = subprocess.run([sys.executable, "tools/gpu_results.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True)
    assert proc.returncode != 0 and "no summary.json" in proc.stderr and "Traceback" not in proc.stderr


def test_a_targeted_rerun_section_is_folded_and_judged(tmp_path):
    """A re-run on a warm GPU (bench_attention --section attention-inline, hd 128) written next to the
    check's files: its section reaches the docs and its rows are judged with the run's name."""
    (tmp_path / "summary.json").write_text(json.dumps({"format": "kerple-gpu-check/1", "tiny": False,
                                                       "device": {"gpu": "NVIDIA H200"}, "steps": []}))
    (tmp_path / "attention.md").write_text(attention_section({2048: (0.5, 0.5)}))
    (tmp_path / "attention-inline.md").write_text(
        attention_section({2048: (1.1, 1.2), 16384: (1.0, 1.3)}, "attention-inline", 128))
    assert results.attention_files(str(tmp_path)) == ["attention", "attention-hd128", "attention-inline"]
    doc, status_page = tmp_path / "benchmarks.md", tmp_path / "status.md"
    doc.write_text("# Benchmarks\n")
    status_page.write_text("<!-- bench:gpu-status:begin -->\n<!-- bench:gpu-status:end -->\n")
    proc = subprocess.run([sys.executable, "tools/gpu_results.py", str(tmp_path), "--doc", str(doc), "--status",
                           str(status_page)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    text = doc.read_text()
    assert markers("attention-inline")[0] in text and markers("attention")[0] in text
    assert "KERPLE-log fwd+bwd, hd 128, attention-inline, triton [inline]" in text
    assert "KERPLE-log fwd+bwd, hd 64, triton [inline]" in text


def test_the_extrapolation_study_runs_only_when_named(tmp_path, monkeypatch):
    """It needs a call of its own (~5 minutes): the full check's plan leaves it out, `--only retrieval`
    runs it alone; its runs go outside OUT_DIR (which comes back whole), its table into it."""
    ran = []
    monkeypatch.setattr(check, "run_step", lambda step, seconds, log: ran.append(step) or
                        {"name": step.name, "status": "ok", "rc": 0, "seconds": 0.0})
    monkeypatch.setattr(check, "device_info", lambda python: {})
    check.run(str(tmp_path / "full"), 560.0, False, sys.executable)
    assert "retrieval" not in [s.name for s in ran] and "test-gpu" in [s.name for s in ran]
    ran.clear()
    check.run(str(tmp_path / "one"), 560.0, False, sys.executable, only=["retrieval"])
    (step,) = ran
    assert step.argv[1] == "tools/extrapolation_study.py" and step.outputs == ["retrieval.md"]
    assert step.argv[step.argv.index("--table") + 1] == str(tmp_path / "one" / "retrieval.md")
    assert not step.argv[step.argv.index("--out") + 1].startswith(str(tmp_path / "one"))
