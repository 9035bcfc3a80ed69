"""The position recipes' bad values (docs/positional.md, "Positions as data") refused by the dry run
and by training alike: a non-zero exit, the key named, no traceback, and no file changed
(tests/integration/test_refusals_change_nothing.py's rule and machinery)."""
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, write_token_dataset
from tests.integration.fault_helpers import child_env
from tests.integration.test_refusals_change_nothing import config, tree


def tokenizer_without_eod(path) -> str:
    """A Hugging Face tokenizers JSON whose vocabulary has no <|endoftext|>."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    return str(path)


def short_range(tmp_path):
    return {"pos_random_max_length": 16}, "pos-random-max-length"  # seq-length is 32


def no_eod(tmp_path):
    return ({"reset_attention_mask": True, "reset_position_ids": True, "tokenizer_type": "HFTokenizer",
             "vocab_file": tokenizer_without_eod(tmp_path / "tokenizer.json")}, "reset-attention-mask")


@pytest.mark.parametrize("command", ["dry-run", "train"])
# A config rule (short_range: every other recipe rule is checked the same way, tests/unit/
# test_position_recipes.py) and the tokenizer's EOD (read from the vocabulary file).
@pytest.mark.parametrize("case", [short_range, no_eod], ids=lambda c: c.__name__)
def test_bad_recipe_refused_by_dry_run_and_training(tmp_path, case, command):
    over, named = case(tmp_path)
    data = write_token_dataset(str(tmp_path / "tiny_text_document"), num_docs=20)
    path = config(tmp_path, data_path=data, **over)
    args = ([os.path.join(ROOT, "deepy.py"), "--dry-run", os.path.join(ROOT, "train.py"), path] if command == "dry-run"
            else [os.path.join(ROOT, "train.py"), path])
    before = tree(tmp_path)
    out = subprocess.run([sys.executable, *args], cwd=tmp_path, env=child_env(), capture_output=True, text=True,
                         timeout=300)
    said = out.stdout + out.stderr
    assert out.returncode != 0, said[-3000:]
    assert named in said and "Traceback" not in said, said[-3000:]
    problems = [line for line in out.stderr.splitlines() if line.strip().startswith("-")]
    assert len(problems) == 1, out.stderr  # one problem: this one
    assert tree(tmp_path) == before, (sorted(set(tree(tmp_path)) ^ set(before)), said[-2000:])
