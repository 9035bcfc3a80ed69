"""Issue 23: integer flags took negatives (and zero where it means nothing) and failed later with
a message naming no flag (`--num-docs -1`: islice's ValueError; `--batch-size 0`: range()).
argparse now refuses them, naming the flag, with exit 2 (megatron/cli_args.py)."""
import pytest

from megatron.cli_args import int_at_least
from megatron.evaluation import sweep as evaluate


@pytest.mark.parametrize("flag,value,bound", [
    ("--batch-size", "0", 1), ("--max-windows", "-3", 1), ("--max-tokens", "0", 1), ("--stride", "-1", 1),
    ("--window", "0", 1), ("--iteration", "-1", 0), ("--blockwise-causal", "-2", 0), ("--max-factor", "0", 1),
    ("--data-seed", "-5", 0), ("--num-fewshot", "-1", 0),
])
def test_evaluate_refuses_out_of_range_counts_naming_the_flag(capsys, flag, value, bound):
    with pytest.raises(SystemExit) as e:
        evaluate.parse_args(["--checkpoint", "ck", flag, value])
    assert e.value.code == 2
    assert f"argument {flag}: must be an integer >= {bound}" in capsys.readouterr().err


def test_the_type_accepts_the_bound_and_names_bad_text():
    parse = int_at_least(1, "(0 = all)")
    assert parse("1") == 1 and parse("64") == 64
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=r"must be an integer >= 1 \(0 = all\), got '1e9'"):
        parse("1e9")
