"""eval.md and the console table name how attention saw each window: a windowed, blockwise or
strided evaluation must not read like a full-attention one."""
import pytest

from megatron.evaluation.report import build_record, markdown_table, write_outputs

META = {"pos_emb": "kerple_log", "checkpoint": "ck", "split": "test", "train_length": 32,
        "window_order": "contiguous", "data_seed": 1}


@pytest.mark.parametrize("extra,label", [
    ({}, "full causal attention"),
    ({"window": 128}, "sliding-window attention W=128"),
    ({"blockwise_causal": 16}, "blockwise causal attention, blocks of 16"),
    ({"mode": "strided", "stride": 64}, "full causal attention, strided evaluation, stride 64"),
    ({"window": 128, "mode": "strided", "stride": 64}, "sliding-window attention W=128, strided evaluation, stride 64"),
])
def test_table_and_header_name_the_attention(tmp_path, extra, label):
    rec = build_record(dict(META, **extra), [])
    assert f"Attention: {label}" in markdown_table(rec)
    paths = write_outputs(rec, [], str(tmp_path))
    header = open(paths["md"]).readline()
    assert header.startswith(f"# Perplexity by length: kerple_log, {label}"), header
