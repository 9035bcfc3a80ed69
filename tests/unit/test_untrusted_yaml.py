"""Config, override and task YAML are untrusted input: a "billion laughs" of nested anchors, values
nested thousands of levels deep, a value that contains itself or a huge file are refused in one
line naming the file and the limit, quickly and in little memory; every real YAML file of the
repository still loads exactly as yaml.safe_load reads it."""
from __future__ import annotations

import glob
import os
import resource
import subprocess
import sys
import time
import tracemalloc

import pytest
import yaml

from megatron.config.sources import read_file
from megatron.config.untrusted_yaml import MAX_BYTES, MAX_DEPTH, MAX_VALUES, YamlLimitError, read_bounded, safe_load
from megatron.errors import UserError
from tests.conftest import ROOT
from tests.integration.fault_helpers import child_env

# 450 bytes: nine aliases of nine aliases ..., 9**9 (387 million) strings once expanded
LAUGHS = "\n".join(['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
                    *(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)),
                    "train-iters: *a8", ""])
DEEP = "train-iters: " + "[" * 3000 + "1" + "]" * 3000 + "\n"


def refused(tmp_path, text: str) -> str:
    """read_file's problem for a config file holding `text`, measured: well under a second and a
    few MiB, however large the value would be."""
    path = tmp_path / "x.yml"
    path.write_text(text)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        _, data, problem = read_file(str(path))
        seconds, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert data is None and problem is not None
    assert seconds < 1 and peak < 20 << 20, (seconds, peak)
    assert "\n" not in problem.message and str(path) in problem.message, problem.message
    return problem.message


def test_billion_laughs_is_refused_before_expansion(tmp_path):
    assert len(LAUGHS) < 512
    message = refused(tmp_path, LAUGHS)
    assert f"more than {MAX_VALUES:,} values, an alias (*name) counting as all" in message and ":6:" in message


def test_deep_nesting_is_refused_without_recursion_error(tmp_path):
    message = refused(tmp_path, DEEP)
    assert f"nested more than {MAX_DEPTH} levels deep" in message, message


def test_a_value_that_contains_itself_is_refused(tmp_path):
    assert "*a is inside its own anchor &a" in refused(tmp_path, "train-iters: &a [1, *a]\n")


def test_a_huge_file_is_refused_without_reading_it_whole(tmp_path):
    with pytest.raises(YamlLimitError, match=r"config file /dev/zero is over 1 MiB \(the limit"):
        read_bounded("/dev/zero", "config file /dev/zero")  # endless: read only to the limit
    message = refused(tmp_path, "# " + "x" * MAX_BYTES + "\n")
    assert "is over 1 MiB" in message


def test_limits_keep_safe_load_semantics():
    assert safe_load("a: &x {b: 1}\nc: *x\nd: {<<: *x, e: 2}", "t") == {"a": {"b": 1}, "c": {"b": 1}, "d": {"b": 1, "e": 2}}
    with pytest.raises(yaml.constructor.ConstructorError):  # no Python tags
        safe_load("!!python/object/apply:os.system ['true']", "t")
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # the deepest allowed
    assert safe_load(nested, "t") is not None
    with pytest.raises(YamlLimitError):
        safe_load("[" + nested + "]", "t")


def test_every_yaml_file_of_the_repository_loads_unchanged():
    """configs/, NeoX's own files (tests/fixtures/neox_configs, verbatim) and every other YAML here."""
    paths = [p for pattern in ("configs/**/*.y*ml", "tests/**/*.y*ml", "docs/**/*.y*ml")
             for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)]
    assert len(paths) > 200 and any("neox_configs" in p for p in paths)
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        assert safe_load(text, path) == yaml.load(text, Loader=yaml.CSafeLoader), path


def test_override_values_have_the_same_limits():
    from megatron.config.overrides import parse_overrides

    with pytest.raises(UserError, match=r"--override x:1:\d+: values nested more than"):
        parse_overrides(["x=" + "[" * 3000 + "]" * 3000])
    flow = "[" + ",".join(["&a0 [1,1,1,1,1,1,1,1,1,1]"] + [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]"
                                                              for i in range(1, 6)]) + "]"
    with pytest.raises(UserError, match=r"--override x:1:\d+: more than 100,000 values"):
        parse_overrides(["x=" + flow])


def test_task_files_are_checked_before_lm_eval_reads_them(tmp_path):
    """Under --include-path, given to --tasks, and included by another task file; lm-eval's own
    tags (`!function`) pass."""
    from megatron.evaluation.harness.task_checks import check_task_file_limits

    tasks = tmp_path / "tasks"
    (tasks / "sub").mkdir(parents=True)
    (tasks / "ok.yaml").write_text("task: ok\nprocess_docs: !function utils.process\ninclude: ../shared.yml\n")
    (tmp_path / "shared.yml").write_text(LAUGHS)
    with pytest.raises(UserError, match=rf"task file {tmp_path}/shared.yml:6:\d+: more than"):
        check_task_file_limits([], [str(tasks)])
    (tmp_path / "shared.yml").write_text("output_type: loglikelihood\n")
    check_task_file_limits([], [str(tasks)])
    (tasks / "sub" / "deep.yaml").write_text(DEEP)
    with pytest.raises(UserError, match="sub/deep.yaml:1:"):
        check_task_file_limits([], [str(tasks)])
    with pytest.raises(UserError, match="deep.yaml:1:"):
        check_task_file_limits([str(tasks / "sub" / "deep.yaml")], [])


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def test_deepy_dry_run_refuses_the_billion_laughs_at_once(tmp_path):
    """As the user ran it: exit 2 and one line, not gigabytes (1 GiB of address space is allowed)."""
    (tmp_path / "x.yml").write_text(LAUGHS)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "deepy.py"), "train.py", str(tmp_path / "x.yml"),
                           "--dry-run"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60,
                          preexec_fn=_limit_memory)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "x.yml:6:5: more than 100,000 values, an alias (*name) counting as all the values it repeats" in proc.stderr
    assert "Traceback" not in proc.stderr and time.perf_counter() - start < 20
