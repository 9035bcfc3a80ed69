"""The benchmark tools at toy sizes: table shape, ratios against the same run's baseline, refused
or failing backends reported in their row, CLI errors (exit 2), and --section rewriting.

The tools run in-process (no second torch import) with one thread, a handful of tokens and one
timed rep, so the figures are meaningless; only the structure is checked."""
import importlib.util
import os

import pytest
import torch

from benchmarks.report import markers, replace_section
from megatron.attention import registry
from megatron.attention.base import AttentionBackend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_tool(name):
    return importlib.import_module(f"benchmarks.{name}")


attn = load_tool("bench_attention")
train = load_tool("bench_train_step")

# Tiny, fast, and restricted to the always-present CPU backends (a triton backend under
# TRITON_INTERPRET=1 would take minutes); the tool itself adds reference (and flex, see no_flex).
ATTN_TINY = ["--quick", "--lengths", "32", "64", "--fwd-only-lengths", "128", "--tokens", "128",
             "--heads", "2", "--head-dim", "16", "--warmup", "0", "--reps", "1"]
TRAIN_TINY = ["--quick", "--steps", "1", "--warmup", "0", "--seq-length", "32", "--micro-batch", "2",
              "--model-overrides", "num-layers=1", "hidden-size=32", "num-attention-heads=2", "padded-vocab-size=128"]


@pytest.fixture(autouse=True)
def keep_threads():
    """--quick sets torch's thread count; give the rest of the session its own back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def no_flex(monkeypatch):
    """The tool always adds flex rows; flex's first CPU call compiles for ~8 s, which is the flex
    tests' business (test_attention_backends), not this file's. `reference` is kept."""
    monkeypatch.setattr(attn, "ALWAYS_BACKENDS", ("reference",))
    monkeypatch.setattr(attn, "BASELINE_ROWS", tuple(r for r in attn.BASELINE_ROWS if r != attn.FLEX_ALIBI))


def table_lines(text: str, first: str | None = None) -> list[list[str]]:
    """A markdown table's rows (header first) as lists of stripped cells: the table whose header
    starts with the cell `first`, or the first table of the text."""
    tables, current = [], []
    for ln in text.splitlines() + [""]:
        if ln.startswith("|"):
            if not ln.startswith("|---"):
                current.append([c.strip() for c in ln.strip("|").split(" | ")])
        elif current:
            tables.append(current)
            current = []
    return next(t for t in tables if first is None or t[0][0] == first)


def test_attention_table_rows_columns_and_ratios():
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "--backends", "sdpa", "reference"])
    rows, baseline, text = attn.run(args)
    lines = table_lines(text, "scheme")
    assert lines[0] == attn.HEADERS
    assert all(len(r) == len(attn.HEADERS) for r in lines)
    measured = {(r.scheme, r.backend, r.length) for r in rows if r.length is not None}
    for backend in ("sdpa", "reference"):
        assert {("kerple_log", backend, n) for n in (32, 64, 128)} <= measured
    assert {("none", "sdpa", n) for n in (32, 64, 128)} <= measured
    flash_ran = any(r.backend == "flash" and r.fb_tflops for r in rows)
    assert baseline == (attn.FLASH_ALIBI if flash_ran else attn.NO_BIAS)
    base = {r.length: r for r in rows if (r.scheme, r.backend) == baseline}
    for r in rows:
        if r.length in (32, 64) and r.fb_tflops is not None:
            assert r.fb_ratio == pytest.approx(r.fb_tflops / base[r.length].fb_tflops)
        if r.length == 128:  # forward-only length: no backward was run, its ratio is the forward one
            assert r.fb_s is None and r.fb_cell == "fwd only"
            if r.fwd_tflops is not None:
                assert r.fwd_ratio == pytest.approx(r.fwd_tflops / base[128].fwd_tflops)
    base_rows = [ln for ln in lines[1:] if "baseline" in ln[0]]
    assert len(base_rows) == 3 and all(ln[6] == "1.00x" for ln in base_rows)
    assert all(ln[9] == "1.00x" for ln in base_rows if ln[2] != "128")
    flash = [ln for ln in lines[1:] if ln[1] == "flash"]  # always a row: measured, or skipped with why
    assert flash and (flash_ran or (flash[0][2] == "all" and flash[0][-1].startswith("skipped:")))


def test_attention_default_schemes_cover_every_fused_kind():
    """Every kind of work the fused kernel does appears in the default table: a new scheme with a
    new kind (or combination) fails here until it is added to FUSED_SCHEMES."""
    from megatron.positional.base import PositionalSpec
    from megatron.positional.registry import build_scheme, scheme_names

    spec = PositionalSpec(num_heads=4, head_dim=8, hidden_size=32, max_position_embeddings=64)

    def signature(name):
        k = build_scheme(name, spec).fused_kernel()
        return None if k is None or k.is_plain else (k.bias, k.has_weight, k.r1 is not None, k.r3 is not None,
                                                     k.tabulate is None)

    fused = {signature(n) for n in scheme_names()} - {None}
    assert fused == {signature(n) for n in attn.FUSED_SCHEMES}
    assert attn.parse_args([]).schemes == attn.FUSED_SCHEMES and attn.parse_args(["--quick"]).schemes == ["kerple_log"]


def test_attention_baseline_order():
    """flash-attn ALiBi when its fwd+bwd ran, else FlexAttention ALiBi, else SDPA without a bias;
    a triton bias-path row is never the baseline."""
    args = attn.parse_args(["--quick"])

    def row(pair, fb, variant=None):
        return attn.Row(*pair, 64, fb_tflops=fb, variant=variant)

    flex, flash, sdpa = row(attn.FLEX_ALIBI, 2.0), row(attn.FLASH_ALIBI, None), row(attn.NO_BIAS, 3.0)
    assert attn.choose_baseline(args, [sdpa, flash, flex]) == attn.FLEX_ALIBI
    assert attn.choose_baseline(args, [sdpa, row(attn.FLASH_ALIBI, 1.0), flex]) == attn.FLASH_ALIBI
    assert attn.choose_baseline(args, [sdpa, row(attn.FLEX_ALIBI, None)]) == attn.NO_BIAS
    assert attn.choose_baseline(args, [row(("alibi", "flex"), 1.0, "table")]) == attn.NO_BIAS
    args.baseline = ("kerple_log", "sdpa")
    assert attn.choose_baseline(args, [flex]) == ("kerple_log", "sdpa")


def test_attention_measures_the_default_bias_path_before_the_other(monkeypatch):
    """--triton-bias both under a short budget: the baselines, then every triton case on the path
    the library picks (what users get), then the other path, then flex and reference. On the H200
    (2026-11-27) KERPLE-log's table path went first and its compiles spent the whole budget: the
    default (inline) path was never measured."""
    monkeypatch.delenv("KERPLE_TRITON_BIAS", raising=False)
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "kerple_power_ap_", "alibi",
                                        "--backends", "triton", "--triton-bias", "both"])
    order = sorted(attn.cases(args), key=attn.priority(args))
    triton = [c for c in order if c[1] == "triton"]
    assert triton[:3] == [("kerple_log", "triton", "inline"), ("kerple_power_ap_", "triton", "inline"),
                          ("alibi", "triton", "inline")]
    assert set(triton[3:]) == {("kerple_log", "triton", "table"), ("kerple_power_ap_", "triton", "table"),
                               ("alibi", "triton", "table")}
    assert order.index(triton[-1]) < min(order.index(c) for c in order if c[1] in ("flex", "reference")
                                         and c[:2] not in attn.BASELINE_ROWS)


def test_attention_triton_bias_rows_and_environment(monkeypatch):
    """--triton-bias both: two triton rows where the path changes the kernel's work (not for T5's
    lookup); each runs with KERPLE_TRITON_BIAS set, and the variable is restored afterwards."""
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "rpe", "--backends", "triton", "sdpa",
                                        "--triton-bias", "both"])
    got = attn.cases(args)
    assert ("kerple_log", "triton", "table") in got and ("kerple_log", "triton", "inline") in got
    assert ("rpe", "triton", None) in got and ("kerple_log", "sdpa", None) in got
    seen = []

    class Recorder(AttentionBackend):
        def forward(self, q, *a, **k):
            seen.append(os.environ.get(attn.BIAS_ENV))
            return q * 1.0

    Recorder.name, Recorder.priority = "recorder", 4999
    monkeypatch.setitem(registry._REGISTRY, "recorder", Recorder)
    monkeypatch.setitem(registry._PRIORITY, "recorder", 4999)
    monkeypatch.setenv(attn.BIAS_ENV, "auto")
    rows = attn.run_case("kerple_log", "recorder", args, lambda msg: None, variant="inline")
    assert set(seen) == {"inline"} and os.environ[attn.BIAS_ENV] == "auto"
    assert all(r.variant == "inline" for r in rows)
    assert attn.backend_label(rows[0]) == "recorder [inline]"


def test_attention_slow_cells_skip_longer_lengths():
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "--backends", "sdpa", "--max-call-seconds", "1e-9"])
    rows = attn.run_case("kerple_log", "sdpa", args, lambda msg: None)
    first, *rest = rows
    assert first.length == 32 and first.fwd_tflops is not None and first.fb_tflops is not None
    assert any("one call (> 1e-09 s)" in n for n in first.notes)
    assert all(r.fwd_cell == "skipped" for r in rest) and rest[0].fb_cell == "skipped"
    assert any("fwd+bwd skipped: > 1e-09 s per call at L=32" in n for n in rest[0].notes)


def test_attention_summaries_put_baselines_and_triton_side_by_side():
    r = attn.Row
    rows = [r("none", "sdpa", 64, fb_tflops=100.0, fwd_tflops=50.0, fb_ratio=1.0, fwd_ratio=1.0),
            r("kerple_log", "triton", 64, fb_tflops=50.0, fb_ratio=0.5, variant="table"),
            r("kerple_log", "flex", 64, fb_tflops=1.0), r("alibi", "flash", None)]
    lines = table_lines(attn.summary(rows, train=True))
    assert lines == [["L", "SDPA no-bias", "ours kerple_log [table]"], ["64", "100 (1.00x)", "50 (0.50x)"]]
    assert table_lines(attn.summary(rows, train=False))[1] == ["64", "50 (1.00x)", "-"]


def test_attention_refused_and_failing_backends_do_not_stop_the_run(monkeypatch):
    class Boom(AttentionBackend):
        def forward(self, *a, **k):
            raise RuntimeError("kernel exploded")

    class Oom(AttentionBackend):
        def forward(self, *a, **k):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80 GiB")

    for name, cls, prio in (("boom", Boom, 5000), ("oomy", Oom, 5001)):
        cls.name, cls.priority = name, prio
        monkeypatch.setitem(registry._REGISTRY, name, cls)
        monkeypatch.setitem(registry._PRIORITY, name, prio)
    # kerple_power_ap_ap multiplies the scores: SDPA refuses it with a reason.
    args = attn.parse_args(ATTN_TINY + ["--fwd-only-lengths", "--lengths", "32", "--schemes", "kerple_power_ap_ap",
                                        "--backends", "sdpa", "boom", "oomy"])
    rows, _, text = attn.run(args)
    by_backend = {r.backend: r for r in rows if r.scheme == "kerple_power_ap_ap"}
    sdpa = by_backend["sdpa"]
    assert sdpa.length is None and "score_weight" in sdpa.notes[0]
    assert by_backend["boom"].fwd_cell == "error" and by_backend["boom"].fb_cell == "error"
    assert any("kernel exploded" in n for n in by_backend["boom"].notes)
    assert by_backend["oomy"].fwd_cell == "OOM" and by_backend["oomy"].fb_cell == "OOM"
    assert by_backend["reference"].fb_tflops is not None  # cells after the failures still ran
    line = next(ln for ln in table_lines(text, "scheme") if ln[1] == "sdpa" and ln[0].startswith("kerple_power_ap_ap"))
    assert line[2] == "all" and "score_weight" in line[-1]


@pytest.mark.parametrize("argv, words", [
    (["--schemes", "kerple_lg"], ["kerple_log", "alibi"]),
    (["--backends", "nope"], ["sdpa", "reference"]),
    (["--baseline", "none-sdpa"], ["SCHEME:BACKEND"]),
    (["--section", "Bad Name"], ["--section"]),
    (["--lengths", "0"], [">= 1"]),
])
def test_attention_bad_arguments_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        attn.parse_args(["--quick", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


@pytest.mark.parametrize("argv, words", [
    (["--schemes", "kerple"], ["kerple_log", "none"]),
    (["--attention-backend", "nope"], ["auto", "sdpa"]),
    (["--model-overrides", "num-layerz=2"], ["num-layerz"]),
    (["--model-overrides", "num-layers"], ["KEY=VALUE"]),
    (["--configs", "configs/paper/missing.yml"], ["missing.yml"]),
    (["--count-layers", "2"], ["--count-layers goes with --count-ops"]),
    (["--count-ops", "--count-layers", "0"], ["--count-layers must be >= 1"]),
    (["--count-path", "pipe"], ["--count-path goes with --count-ops"]),
    (["--count-ops", "--count-path", "pipe", "--precision", "fp32"], ["DeepSpeed precision", "--precision"]),
])
def test_train_bad_arguments_exit_2(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        train.parse_args(["--quick", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_train_step_table_and_overhead_against_none():
    args = train.parse_args(TRAIN_TINY + ["--schemes", "kerple_log", "rotary", "none"])
    results, text = train.run(args)
    assert [r.scheme for r in results] == ["kerple_log", "rotary", "none"]
    none = results[-1]
    for r in results:
        assert r.sec_per_step > 0 and r.tokens_per_s == pytest.approx(2 * 32 / r.sec_per_step)
        assert r.backend in registry.backend_classes()
        assert r.overhead_pct == pytest.approx((r.sec_per_step / none.sec_per_step - 1) * 100)
    lines = table_lines(text)
    assert lines[0] == ["scheme", "backend (auto)", "params", "sec/step", "tokens/s", "peak GiB", "vs none", "note"]
    assert [ln[0] for ln in lines[1:]] == ["kerple_log", "rotary", "none"]
    assert lines[-1][6] == "+0.0%"
    assert "1 layers, hidden 32, 2 heads, vocab 128" in text and "CPU figures" in text


def test_train_step_count_ops_table(tmp_path):
    """--count-ops: one counted step per scheme and depth on auto's CUDA backend (the Triton kernels
    stand-ins on this CPU), a table per scheme and what the differences are made of, in its own section."""
    out = tmp_path / "bench.md"
    argv = TRAIN_TINY + ["--count-ops", "--schemes", "kerple_log", "alibi", "none", "--count-layers", "3", "2",
                         "--out", str(out)]
    assert train.main(argv) == 0
    text = out.read_text()
    assert "<!-- bench:train-ops:begin -->" in text and "counted stand-ins" in text
    lines = table_lines(text)
    assert lines[0][:6] == ["scheme", "backend", "launches, 2 layers", "launches, 3 layers", "per layer",
                            "attention kernels, 3 layers"]
    rows = {ln[0]: ln for ln in lines[1:]}
    assert rows["kerple_log"][1] == rows["alibi"][1] == "triton" and rows["none"][1] == "sdpa"
    assert rows["kerple_log"][4] == rows["alibi"][4]  # the same launches per layer
    assert rows["alibi"][5] == "bwd_dkdv 3, bwd_dq 3, fwd 6"  # the forward recomputed (checkpointing)
    assert all(rows[s][6] == "0" for s in rows)  # host syncs: the positions are known on the host
    over = rows["kerple_log"][7].split(" / ")
    assert len(over) == 2 and over[0] == over[1] and int(over[0]) > 0
    diffs = {ln[0]: ln for ln in table_lines(text, "schemes")[1:]}
    assert int(diffs["kerple_log over alibi"][1]) == int(over[1]) and "clamp +2" in diffs["kerple_log over alibi"][2]


def test_train_step_count_ops_through_the_pipeline_engine(tmp_path):
    """--count-path pipe: deepy.py's path for the paper's config (DeepSpeed's pipeline engine around
    GPTPipe, its bf16 optimizer); the same launches per layer for KERPLE-log and ALiBi, and where
    each host sync comes from: DeepSpeed's optimizer only (the positions' check answers on the host)."""
    out = tmp_path / "bench.md"
    argv = TRAIN_TINY + ["--count-ops", "--count-path", "pipe", "--schemes", "kerple_log", "alibi",
                         "--count-layers", "3", "2", "--out", str(out), "--section", "train-ops-pipe"]
    assert train.main(argv) == 0
    text = out.read_text()
    assert "<!-- bench:train-ops-pipe:begin -->" in text and "DeepSpeed's pipeline engine" in text
    assert "DeepSpeed bf16 (the config's)" in text
    rows = {ln[0]: ln for ln in table_lines(text)[1:]}
    assert rows["kerple_log"][4] == rows["alibi"][4]  # the same launches per layer
    where = table_lines(text[text.index("Where the host syncs"):], "scheme")[1:]
    assert where and all(w[2].startswith("`deepspeed.") for w in where), where


def test_train_step_table4_ratios():
    """The paper's Table 4 ratios: ours from the same run's sec/step, the paper's from its column,
    a pair shown only when both schemes ran; goals judged against our ratio."""
    args = train.parse_args(TRAIN_TINY + ["--schemes", "kerple_log", "alibi", "none"])
    results, text = train.run(args)
    sec = {r.scheme: r.sec_per_step for r in results}
    rows = {r[0]: r for r in train.ratio_rows(results, judge=False)}
    assert set(rows) == {"kerple_log vs alibi", "kerple_log vs none"}
    assert rows["kerple_log vs alibi"][1] == f"{(sec['kerple_log'] / sec['alibi'] - 1) * 100:+.1f}%"
    assert rows["kerple_log vs alibi"][2] == "+1.7%"  # 0.307 / 0.302
    assert rows["kerple_log vs none"][2] == "- (no such row)"
    assert rows["kerple_log vs none"][3] == "<= +5%: a GPU goal, not judged here"  # a CPU run
    judged = {r[0]: r for r in train.ratio_rows(results, judge=True)}
    met = sec["kerple_log"] / sec["none"] - 1 <= 0.05
    assert judged["kerple_log vs none"][3] == f"<= +5%: {'met' if met else 'not met'}"
    assert "paper Table 4 (A100, unfused)" in text and "| kerple_log vs alibi |" in text
    assert "a GPU goal, not judged here" in text
    fake = [train.Result("kerple_log", sec_per_step=0.2), train.Result("sinusoidal", sec_per_step=0.1)]
    assert train.ratio_rows(fake) == [["kerple_log vs sinusoidal", "+100.0%", "+3.0%", "-"]]


def test_train_step_refused_backend_shows_reason():
    args = train.parse_args(TRAIN_TINY + ["--attention-backend", "sdpa", "--schemes", "kerple_power_ap_ap", "none"])
    results, text = train.run(args)
    assert results[0].cell == "refused" and "score_weight" in results[0].notes[0]
    assert results[1].sec_per_step is not None and results[0].overhead_pct is None
    assert "backend (sdpa)" in text


def test_replace_section_keeps_the_rest(tmp_path):
    path = tmp_path / "bench.md"
    begin, end = markers("train")
    path.write_text(f"# Title\n\nintro\n\n{begin}\nold train\n{end}\n\n## Notes\nkeep me\n")
    replace_section(str(path), "attention", "new attention")  # absent: appended
    replace_section(str(path), "train", "new train")  # present: replaced in place
    text = path.read_text()
    assert text.startswith("# Title\n\nintro\n\n" + begin + "\nnew train\n" + end + "\n\n## Notes\nkeep me\n")
    assert "old train" not in text and text.rstrip().endswith(markers("attention")[1])
    replace_section(str(path), "attention", "newer attention")
    assert text.replace("new attention", "newer attention") == path.read_text()
    path.write_text(f"{markers('x')[0]}\nhalf a section\n")
    with pytest.raises(ValueError, match="only one of the markers"):
        replace_section(str(path), "x", "body")


def test_attention_out_rewrites_only_its_section(tmp_path):
    path = tmp_path / "bench.md"
    begin, end = markers("train")
    path.write_text(f"# Benchmarks\n\nhand-written\n\n{begin}\ntrain figures\n{end}\n")
    argv = ATTN_TINY + ["--fwd-only-lengths", "--lengths", "32", "--schemes", "none", "--backends", "sdpa",
                        "--out", str(path), "--section", "attention"]
    assert attn.main(argv) == 0
    text = path.read_text()
    assert text.startswith(f"# Benchmarks\n\nhand-written\n\n{begin}\ntrain figures\n{end}\n")
    assert "## Attention kernels" in text and "command: `python tools/bench_attention.py --quick" in text
    assert "torch " + torch.__version__ in text


def test_train_step_eval_length_columns():
    # learned positions cannot go past max-position-embeddings (32 here): an eval error cell, not a crash.
    args = train.parse_args(TRAIN_TINY + ["--schemes", "alibi", "learned", "--eval-length", "64"])
    results, text = train.run(args)
    alibi, learned = results
    assert alibi.eval_s > 0 and alibi.eval_cell == "-"
    assert learned.sec_per_step is not None and learned.eval_cell == "error"
    assert any(n.startswith("eval: error") for n in learned.notes)
    header = table_lines(text)[0]
    assert header[-3:] == ["eval 64 s", "eval 64 peak GiB", "note"]
    assert table_lines(text)[2][-3] == "error"


def test_eval_forward_tool_interleaves_variants_against_none(capsys):
    """tools/bench_eval_forward.py: one row per (length, variant), ratios against `none`."""
    tool = load_tool("bench_eval_forward")
    assert tool.main(["--variants", "none", "kerple_log", "alibi@reference", "--lengths", "32", "64",
                      "--layers", "1", "--hidden", "32", "--heads", "2", "--vocab", "64", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("| tokens |"):].splitlines()[2:]
    assert [row.split("|")[1:3] for row in table] == [
        [f" {n} ", f" {v} "] for n in (32, 64) for v in ("none", "kerple_log", "alibi@reference")]
    assert all(row.split("|")[4].strip() == "1.00" for row in table if "| none |" in row)


def test_train_step_profile_says_where_the_time_goes():
    """--profile: a table of time per kernel category per scheme, and the first scheme's heaviest
    kernels beside the same kernels in the others (CPU here: operators' own CPU time)."""
    args = train.parse_args(TRAIN_TINY + ["--schemes", "kerple_log", "none", "--profile", "kerple_log", "none"])
    results, text = train.run(args)
    assert all(r.profile for r in results), [r.notes for r in results]
    assert "Where a step's time goes" in text and "| ms per step | kerple_log | none |" in text
    assert "| matmul |" in text and "**total**" in text and "kerple_log's 10 heaviest" in text
    kerple = results[0].profile
    assert sum(kerple.values()) > 0 and any("mm" in name for name in kerple)


def test_train_step_profile_only_measured_schemes(capsys):
    with pytest.raises(SystemExit) as e:
        train.parse_args(TRAIN_TINY + ["--schemes", "none", "--profile", "alibi"])
    assert e.value.code == 2 and "profile only schemes measured in this run" in capsys.readouterr().err


def test_profile_categories():
    from benchmarks.profile import OTHER, category

    assert category("attention_fwd_kernel") == "attention fwd (ours)"
    assert category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert category("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == \
        "attention (torch: sdpa, flash, flex)"
    assert category("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>") == OTHER


def test_attention_skip_backends_drops_even_the_always_measured(capsys):
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "--backends", "sdpa", "--skip-backends",
                                        "reference"])
    got = attn.cases(args)
    assert ("kerple_log", "sdpa", None) in got and not any(c[1] == "reference" for c in got)
    assert any(c[1] == "reference" for c in attn.cases(attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log"])))
    with pytest.raises(SystemExit) as e:
        attn.parse_args(ATTN_TINY + ["--skip-backends", "refrence"])
    assert e.value.code == 2 and "reference" in capsys.readouterr().err


def test_attention_writes_its_section_after_every_case():
    """A run killed at its call's timeout still leaves the cells it finished (a lent GPU's re-run
    on 2026-11-27 returned nothing: the file was written at the end only)."""
    args = attn.parse_args(ATTN_TINY + ["--schemes", "kerple_log", "--backends", "sdpa"])
    seen = []
    rows, _, final = attn.run(args, on_case=seen.append)
    n = len(attn.cases(args))
    assert len(seen) == n - 1 and n >= 3
    assert f"**partial: 1 of {n} cases measured when this was written**" in seen[0]
    assert "partial" not in final and seen[-1].count("\n| ") < final.count("\n| ")


def test_train_step_writes_its_section_after_every_scheme():
    args = train.parse_args(TRAIN_TINY + ["--schemes", "kerple_log", "none"])
    seen = []
    _, final = train.run(args, on_scheme=seen.append)
    assert len(seen) == 1 and "**partial: 1 of 2 schemes measured when this was written**" in seen[0]
    assert "| kerple_log |" in seen[0] and "partial" not in final


# ---- the data path alone (tools/bench_data_loader.py) --------------------------------------------
loader_tool = load_tool("bench_data_loader")


def test_data_loader_rows_per_worker_count_against_the_goal(tmp_path):
    """The paper's config's batches (32 x 512, through pipe_batches) from a random corpus: one row
    per --workers count, the rate set against --goal, and the section written."""
    out = tmp_path / "bench.md"
    assert loader_tool.main(["--steps", "4", "--workers", "0", "1", "--goal", "1000", "--out", str(out)]) == 0
    text = out.read_text()
    assert "<!-- bench:data-loader:begin -->" in text and "micro-batch 32 x 512 tokens" in text
    lines = table_lines(text)
    assert lines[0] == ["workers", "first batch s", "batches timed", "tokens/s", "vs goal", "ms per micro-batch"]
    rows = {ln[0]: ln for ln in lines[1:]}
    assert set(rows) == {"0", "1"} and all(r[2] == "3" for r in rows.values())
    for r in rows.values():
        rate = float(r[3].replace(",", ""))
        assert r[4] == f"{rate / 1000:.1f}x" and abs(float(r[5]) - 32 * 512 / rate * 1e3) < 0.01


@pytest.mark.parametrize("argv,message", [(["--workers", "-1"], "--workers must be >= 0"),
                                          (["--steps", "0"], "--steps must be >= 1")])
def test_data_loader_refuses_bad_flags(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        loader_tool.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
