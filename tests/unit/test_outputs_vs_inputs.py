"""Issue 35, class 2: inputs are sacred. No tool writes into, or with --overwrite deletes, one of its
inputs (megatron/outputs_vs_inputs.py, the one rule), in both directions, through symlinks too;
and several inputs never share one output. Every entry point is answered before anything is read:
the checkpoints here are empty layouts (tests/conftest.checkpoint_layout)."""
import os

import pytest

from megatron.outputs_vs_inputs import OutputOverlapsInput, overlap, refuse_overlap, refuse_shared_outputs
from tests.conftest import checkpoint_layout


def test_the_rule_in_both_directions_and_through_links(tmp_path):
    ck = checkpoint_layout(tmp_path / "run" / "checkpoints")
    (tmp_path / "link").symlink_to(ck)
    assert overlap(ck, ck) == "is"
    assert overlap(str(tmp_path / "link"), ck) == "is"  # a symlink to the input is the input
    assert overlap(os.path.join(ck, "..", "checkpoints"), ck) == "is"
    assert overlap(str(tmp_path / "link" / "hf"), ck) == "lies inside"  # not created yet: where it would be
    assert overlap(str(tmp_path / "run"), ck) is None  # results written beside the checkpoints: fine
    assert overlap(str(tmp_path / "run"), ck, replaced_whole=True) == "holds"  # --overwrite would delete it
    assert overlap(str(tmp_path / "other"), ck, replaced_whole=True) is None
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    os.link(data, tmp_path / "hard.jsonl")
    assert overlap(str(tmp_path / "hard.jsonl"), str(data)) == "is"  # a hard link is the same file
    assert overlap(str(tmp_path / "data.jsonl.out"), str(data)) is None  # beside a file is not inside it
    with pytest.raises(OutputOverlapsInput, match=r"--out .*link \(really .*checkpoints\) is the checkpoint being "
                                                  r"read .*deleted first, with --overwrite.*choose a --out outside"):
        refuse_overlap("--out", str(tmp_path / "link"), [("the checkpoint being read (--checkpoint)", ck)], True)


def test_several_inputs_never_share_an_output(tmp_path):
    refuse_shared_outputs("--out", [("a", "out/a"), ("b", "out/b")])
    with pytest.raises(OutputOverlapsInput, match="a and b would both write their results to --out out/x"):
        refuse_shared_outputs("--out", [("a", "out/x"), ("b", "out/x")])
    with pytest.raises(OutputOverlapsInput, match="is given twice"):
        refuse_shared_outputs("--out", [(str(tmp_path), "out/x"), (str(tmp_path / "."), "out/x")])


def test_export_hf_never_deletes_the_checkpoint_it_reads(tmp_path):
    """export_hf.py --out CKPT --overwrite used to delete the checkpoints it was exporting."""
    from megatron.interop.export_command import main

    ck = checkpoint_layout(tmp_path / "ck")
    for out in (ck, os.path.join(ck, "hf"), str(tmp_path)):
        with pytest.raises(OutputOverlapsInput, match=f"--out {out} (is|lies inside|holds) the checkpoint being read"):
            main(["--checkpoint", ck, "--out", out, "--overwrite"])
    assert sorted(os.listdir(ck)) == ["global_step4", "latest"]


# each tool's logic lives in the package; tools/<name>.py only calls its main
TOOL_MODULES = {"merge_tp_checkpoint": "megatron.checkpoint.merge_command",
                "convert_neox_checkpoint": "megatron.checkpoint.convert_command",
                "import_hf": "megatron.interop.import_command"}


@pytest.mark.parametrize("tool", ["merge_tp_checkpoint", "convert_neox_checkpoint", "import_hf"])
def test_checkpoint_writers_stay_out_of_their_input(tool, tmp_path):
    """Both directions: an --output inside the input was accepted (a checkpoint written into another one)."""
    import importlib

    main = importlib.import_module(TOOL_MODULES[tool]).main
    ck = checkpoint_layout(tmp_path / "ck")
    for out in (os.path.join(ck, "merged"), str(tmp_path)):
        with pytest.raises(OutputOverlapsInput, match=f"--output {out} (lies inside|holds) the "):
            main(["--input", ck, "--output", out, "--overwrite"])
    assert sorted(os.listdir(ck)) == ["global_step4", "latest"]


def test_evaluate_never_writes_into_a_checkpoint(tmp_path):
    from megatron.evaluation import sweep as evaluate

    a, b = checkpoint_layout(tmp_path / "a"), checkpoint_layout(tmp_path / "b")
    for argv in (["--checkpoint", a, "--out", a], ["--checkpoint", a, "--out", os.path.join(a, "eval")],
                 ["--checkpoint", a, b, "--out", a]):  # with several: b's results would go to a/b
        with pytest.raises(OutputOverlapsInput, match=r"--out .* (is|lies inside) the checkpoint being evaluated"):
            evaluate.main([*argv, "--lengths", "8"])
    assert sorted(os.listdir(a)) == ["global_step4", "latest"]


def test_evaluate_gives_checkpoints_of_the_same_name_their_own_results(tmp_path):
    """Two runs' checkpoints/ named alike (x/run1, y/run1) used to share --out/run1: the second's
    results replaced the first's. Each now gets the shortest name that tells it apart."""
    from megatron.evaluation import sweep as evaluate

    cks = [checkpoint_layout(tmp_path / d / "run1" / "checkpoints") for d in ("x", "y")]
    other = checkpoint_layout(tmp_path / "z" / "run2" / "checkpoints")
    args = evaluate.parse_args(["--checkpoint", *cks, other, "--out", str(tmp_path / "res")])
    assert [os.path.relpath(evaluate.output_dir(args, c), tmp_path) for c in (*cks, other)] == [
        "res/x_run1", "res/y_run1", "res/run2"]
    for twice in (cks[0], os.path.join(cks[0], ".")):
        with pytest.raises(OutputOverlapsInput, match="is given twice"):
            evaluate.main(["--checkpoint", cks[0], twice, "--out", str(tmp_path / "res")])
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("save", ["ck", "ck/ft"])
def test_a_finetune_never_saves_into_the_checkpoints_it_starts_from(save, tmp_path, tiny_config):
    """finetune from a run's checkpoints with save = load restarted at iteration 0: its first save
    replaced a step it was started from and moved `latest` back."""
    from megatron.training.checkpoint import Checkpointer

    ck = checkpoint_layout(tmp_path / "ck")
    cfg = tiny_config(load=ck, save=str(tmp_path / save), finetune=True, save_interval=2)
    with pytest.raises(OutputOverlapsInput, match=r"save: .*(is|lies inside) the checkpoints this run starts from "
                                                  r"at iteration 0 .*global_step4.*give this run its own `save`"):
        Checkpointer(cfg, 128).load(engine=None)
    assert sorted(os.listdir(ck)) == ["global_step4", "latest"]


def test_preprocess_never_writes_among_or_over_its_input(tmp_path):
    """--output-prefix inside an --input directory put the .bin among the documents the next run
    of the same command reads; a prefix whose .bin is the input file would replace it."""
    from megatron.data.preprocess import preprocess
    from megatron.tokenizer import build_tokenizer

    docs = tmp_path / "raw"
    docs.mkdir()
    (docs / "a.jsonl").write_text('{"text": "hello"}\n')
    tok = build_tokenizer("CharLevelTokenizer")
    with pytest.raises(OutputOverlapsInput, match=r"--output-prefix .*raw/x_text_document.bin lies inside the data "
                                                  r"being read \(--input\)"):
        preprocess([str(docs)], tok, str(docs / "x"), overwrite=True)
    assert os.listdir(docs) == ["a.jsonl"]
    (tmp_path / "y_text_document.bin").write_text('{"text": "a document file with a .bin name"}\n')
    with pytest.raises(OutputOverlapsInput, match="y_text_document.bin is the data being read"):
        preprocess([str(tmp_path / "y_text_document.bin")], tok, str(tmp_path / "y"), overwrite=True)
    assert preprocess([str(docs / "a.jsonl")], tok, str(docs.parent / "ok"))["documents"] == 1  # beside it: fine


def test_prepare_data_never_rewrites_its_pile_input(tmp_path):
    """pile --input data/x/x.jsonl.zst --name x rewrote the user's file as its own archive (cut short by --max-mb)."""
    from megatron.data.prepare_command import main

    (tmp_path / "x").mkdir()
    src = tmp_path / "x" / "x.jsonl.zst"
    src.write_bytes(b"the user's shard")
    with pytest.raises(OutputOverlapsInput, match=r"--name .*x/x.jsonl.zst is the input being read \(--input\).*give "
                                                  "another --name"):
        main(["pile", "--input", str(src), "--name", "x", "--data-dir", str(tmp_path)])
    assert src.read_bytes() == b"the user's shard" and os.listdir(tmp_path / "x") == ["x.jsonl.zst"]


def test_convert_never_deletes_the_configs_it_reads(tmp_path):
    from megatron.checkpoint.convert_command import main

    ck = checkpoint_layout(tmp_path / "ck")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "neox.yml").write_text("{}")
    with pytest.raises(OutputOverlapsInput, match=r"--output .*out holds a NeoX config being read \(--config\)"):
        main(["--input", ck, "--output", str(tmp_path / "out"), "--config", str(tmp_path / "out" / "neox.yml"),
              "--overwrite"])
