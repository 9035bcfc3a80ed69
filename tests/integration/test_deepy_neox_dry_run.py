"""`deepy.py --dry-run` on NeoX's own 20B.yml with its local_setup.yml, on a machine without the
data: the full parameter count (padded-vocab-size standing in for the tokenizer file), the missing
hostfile as DeepSpeed's warning, and "config OK; missing files only" with its own exit status,
told apart from a config that is wrong."""
import os

from megatron.errors import EXIT_MISSING_INPUTS, EXIT_USER_ERROR
from tests.conftest import ROOT
from tests.integration.test_deepy_cli import deepy

NEOX = os.path.join(ROOT, "tests", "fixtures", "neox_configs")
FILES = [os.path.join(NEOX, "20B.yml"), os.path.join(NEOX, "local_setup.yml")]


def test_neox_20b_dry_run_is_config_ok_with_files_missing():
    proc = deepy("--dry-run", "train.py", *FILES, "-o", "padded-vocab-size=50432", "-o", "hostfile=/mock_path")
    assert proc.returncode == EXIT_MISSING_INPUTS and "Traceback" not in proc.stderr, proc.stderr
    assert "parameters: 20,554,567,680\n" in proc.stdout  # Hugging Face's GPT-NeoX-20B (test_neox_config_parity)
    assert "hostfile '/mock_path' does not exist. Unable to find hostfile" in proc.stdout
    assert "config OK; missing files only" in proc.stderr and "invalid configuration" not in proc.stderr
    assert "enwik8_text_document.bin" in proc.stderr  # local_setup.yml's data, not on this machine


def test_without_padded_vocab_size_the_rest_is_still_counted():
    proc = deepy("--dry-run", "train.py", *FILES)
    assert proc.returncode == EXIT_MISSING_INPUTS, proc.stderr
    # 20,554,567,680 = 19,934,859,264 + 50,432 entries x 12,288 (untied: 2 x hidden 6144)
    assert "parameters: 19,934,859,264 + 12,288 per vocabulary entry" in proc.stdout
    assert "vocab-file = 'data/gpt2-vocab.json'" in proc.stderr and "set padded-vocab-size" in proc.stderr


def test_a_wrong_config_is_a_config_error_not_missing_files():
    proc = deepy("--dry-run", "train.py", *FILES, "-o", "num-attention-heads=63")
    assert proc.returncode == EXIT_USER_ERROR and "Traceback" not in proc.stderr, proc.stderr
    assert "invalid configuration" in proc.stderr and "config OK" not in proc.stderr
    assert "hidden-size = 6144" in proc.stderr and "num-attention-heads = 63" in proc.stderr  # both rules
    assert "parameters:" not in proc.stdout
