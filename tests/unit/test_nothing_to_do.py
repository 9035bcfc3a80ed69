"""Issue 35, class 5: a command that would do nothing says so and exits non-zero, naming the input
and the fix (it used to exit 0 having done nothing, or to print a traceback). In-process, before
any model or checkpoint is loaded."""

import pytest

from megatron.errors import UserError
from tests.conftest import checkpoint_layout


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_generate_on_an_empty_prompt_file_says_so(tmp_path, content):
    from megatron import generate_command as generate

    prompts = tmp_path / "prompts.txt"
    prompts.write_text(content)
    with pytest.raises(UserError, match=f"--prompt-file {prompts} holds no prompt .*nothing to generate.*one prompt "
                                        "per line"):
        generate.main(["--checkpoint", checkpoint_layout(tmp_path / "ck"), "--prompt-file", str(prompts)])
    with pytest.raises(UserError, match="--prompt is empty: nothing to generate"):
        generate.main(["--checkpoint", str(tmp_path / "ck"), "--prompt", " "])


def _matrix(tmp_path) -> str:
    from study.experiments import write_matrix

    write_matrix(["kerple_log", "alibi"], {"code": "data/code/code_text_document"}, [1235], str(tmp_path / "m"),
                 str(tmp_path / "runs"), [])
    return str(tmp_path / "m" / "matrix.json")


def _run_matrix(*argv):
    from study.run_matrix import main

    return main(list(argv))


def test_run_matrix_filters_that_select_nothing_are_named(tmp_path, capsys):
    """--only with a typo ran nothing, said nothing and exited 0."""
    matrix = _matrix(tmp_path)
    with pytest.raises(UserError, match=rf"--only 'kerpel' matches no run of {matrix} \(2 runs: kerple_log_code_1235, "
                                        r"alibi_code_1235\); did you mean 'kerple_log'\?; nothing was run"):
        _run_matrix(matrix, "--only", "kerpel")
    with pytest.raises(UserError, match=r"--shard 3/3 leaves no run: .*2 runs.*use N <= 2; nothing was run"):
        _run_matrix(matrix, "--shard", "3/3")
    with pytest.raises(UserError, match=r"--only 'alibi' matches no run of .* --index 0 .*kerple_log_code_1235"):
        _run_matrix(matrix, "--index", "0", "--only", "alibi")
    with pytest.raises(UserError, match=r"--windowed-only 'kerple-lgo' is no scheme of .*\(kerple_log, alibi\); did you "
                                        r"mean 'kerple_log'\?"):  # every windowed evaluation silently skipped
        _run_matrix(matrix, "--windowed", "L", "--windowed-only", "kerple-lgo")
    with pytest.raises(UserError, match="--windowed-only kerple_log applies to --windowed W, which is not given"):
        _run_matrix(matrix, "--windowed-only", "kerple_log")
    assert capsys.readouterr().out == "" and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("edit,message", [
    (lambda text: text[:-3], r"is not valid JSON \(line \d+, column \d+: .*\); fix it by hand or write it again with "
                             "tools/make_experiments.py"),
    (lambda text: "[]", r"must be a JSON object with base_configs and runs"),
    (lambda text: text.replace('"base_configs"', '"base_config"'),
     r"unknown field 'base_config' \(did you mean 'base_configs'\?\); has no base_configs"),
    (lambda text: text.replace('"run_dir"', '"rundir"', 1), r"run 0 \(kerple_log_code_1235\): unknown field 'rundir' "
                                                            r"\(did you mean 'run_dir'\?\), missing field run_dir"),
    (lambda text: text.replace('"seed": 1235', '"seed": "x"', 1), r"run 0 \(kerple_log_code_1235\): seed 'x' must be "
                                                                  "an integer"),
    (lambda text: text.replace("alibi_code_1235", "kerple_log_code_1235"), r"runs 0 and 1 share the name "
                                                                          r"kerple_log_code_1235"),
    (lambda text: text.replace('"runs": [', '"runs": [], "x": ['), r"unknown field|lists no run"),
    (lambda text: "[" * 100_000 + "]" * 100_000, r"nests its values too deeply"),  # was a RecursionError traceback
])
def test_a_hand_edited_matrix_is_named_in_one_message(tmp_path, edit, message):
    """A hand-edited matrix.json gave a traceback (KeyError, TypeError) or a JSON error naming no file."""
    matrix = _matrix(tmp_path)
    with open(matrix) as f:
        text = f.read()
    with open(matrix, "w") as f:
        f.write(edit(text))
    with pytest.raises(UserError, match=rf"matrix {matrix}.*{message}"):
        _run_matrix(matrix)
