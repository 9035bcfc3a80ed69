"""Output paths not set by the user derive from run-dir (megatron/config/paths.py)."""
from __future__ import annotations

import os

from megatron.config import NeoXConfig, load_config
from megatron.config.paths import outside_run_dir
from tests.conftest import ROOT, TINY_MODEL

QUICKSTART = os.path.join(ROOT, "configs", "quickstart.yml")


def paths(cfg) -> tuple:
    return (cfg.logging.run_dir, cfg.checkpoint.save, cfg.checkpoint.load, cfg.logging.tensorboard_dir,
            cfg.logging.log_dir)


def test_quickstart_writes_and_resumes_under_its_run_dir():
    cfg = load_config([QUICKSTART])
    assert paths(cfg) == ("runs/quickstart", "runs/quickstart/checkpoints", "runs/quickstart/checkpoints",
                          "runs/quickstart/tensorboard", "runs/quickstart/logs")
    assert outside_run_dir(cfg) is None


def test_run_dir_override_moves_checkpoints_tensorboard_and_logs():
    """-o run-dir=runs/x used to move only metrics and the resolved config: checkpoints and
    TensorBoard stayed in runs/quickstart/, which the next run silently resumed from."""
    cfg = load_config([QUICKSTART], overrides={"run-dir": "runs/x"})
    assert paths(cfg) == ("runs/x", "runs/x/checkpoints", "runs/x/checkpoints", "runs/x/tensorboard", "runs/x/logs")
    rotary = load_config([QUICKSTART, os.path.join(ROOT, "configs", "quickstart_rotary.yml")])
    assert rotary.checkpoint.save == "runs/quickstart_rotary/checkpoints"


def test_given_paths_and_nulls_are_kept_and_outside_paths_are_announced():
    base = {**TINY_MODEL, "run-dir": "runs/a", "save-interval": 5}
    cfg = load_config([], overrides={**base, "save": "elsewhere/ck", "tensorboard-dir": None})
    assert cfg.checkpoint.save == "elsewhere/ck" and cfg.checkpoint.load is None  # NeoX: load only if given
    assert cfg.logging.tensorboard_dir is None
    assert outside_run_dir(cfg) == "note: save elsewhere/ck is outside run-dir runs/a (set in the config)"
    cfg = load_config([], overrides={**base, "load": "old/ck"})
    assert cfg.checkpoint.save == "runs/a/checkpoints" and "load old/ck is outside" in outside_run_dir(cfg)
    no_save = load_config([], overrides={**TINY_MODEL, "run-dir": "runs/a"})
    assert no_save.checkpoint.save is None and no_save.checkpoint.load is None  # no interval: never saves


def test_neox_config_without_run_dir_keeps_run_dir_equal_to_save():
    cfg = load_config([], overrides={**TINY_MODEL, "save": "ck", "load": "ck", "save-interval": 5})
    assert cfg.logging.run_dir == "ck" and outside_run_dir(cfg) is None


def test_resolved_config_states_derived_paths_and_replace_rederives(tmp_path):
    cfg = load_config([QUICKSTART])
    cfg.save(tmp_path / "resolved_config.yml")
    again = NeoXConfig.from_file(tmp_path / "resolved_config.yml")
    assert paths(again) == paths(cfg)
    assert paths(cfg.replace(run_dir="runs/y"))[1] == "runs/y/checkpoints"


def test_a_save_interval_without_a_save_directory_is_said(tmp_path):
    """A resolved config stacked under another carries `save: null`, which run-dir does not replace:
    the run would keep no checkpoint without a word (found running configs/extend/ on an imported model)."""
    from megatron.config.paths import saves_nothing
    from tests.conftest import TINY_MODEL, write_yaml

    base = load_config([write_yaml(tmp_path / "a.yml", {**TINY_MODEL, "save": None, "load": "ck"})])
    stacked = load_config([write_yaml(tmp_path / "b.yml", {**TINY_MODEL, "save": None, "load": "ck",
                                                           "save-interval": 10})])
    assert saves_nothing(base) is None  # no interval: nothing meant to be saved
    assert "save-interval 10 is set but no save directory" in saves_nothing(stacked)
    derived = load_config([write_yaml(tmp_path / "c.yml", {**TINY_MODEL, "save-interval": 10})])
    assert derived.checkpoint.save and saves_nothing(derived) is None


def test_train_data_paths_take_precedence_over_data_path_as_in_neox(tmp_path):
    """NeoX's pythia/14M.yml sets train/valid/test-data-paths on top of local_setup.yml's data-path:
    NeoX builds from the paths (data_utils.py) and so does this stack, saying data-path is unused."""
    from megatron.config.paths import unused_data_path
    from tests.conftest import TINY_MODEL, write_yaml

    cfg = load_config([write_yaml(tmp_path / "a.yml", {**TINY_MODEL, "data-path": "data/x/x_text_document",
                                                       "train-data-paths": ["data/y/y_text_document"],
                                                       "test-data-paths": ["data/z/z_text_document"]})])
    assert cfg.data.single_path is None and "data-path data/x/x_text_document is not used" in unused_data_path(cfg)
    alone = load_config([write_yaml(tmp_path / "b.yml", {**TINY_MODEL, "data-path": "data/x/x_text_document"})])
    assert alone.data.single_path == "data/x/x_text_document" and unused_data_path(alone) is None


def test_a_resolved_config_stacked_under_a_new_run_lets_its_derived_paths_follow(tmp_path):
    """Issue 43: the fine-tuning recipe (an import's resolved_config.yml, then a file with its own
    run-dir) wrote TensorBoard to the imported run's directory: the resolved config states every
    derived path, and they counted as the user's. Paths a user did give stay, and are announced."""
    first = load_config([QUICKSTART], overrides={"run-dir": str(tmp_path / "imported")})
    resolved = tmp_path / "imported" / "resolved_config.yml"
    os.makedirs(resolved.parent)
    first.save(str(resolved))
    new_run = tmp_path / "new.yml"
    new_run.write_text(f"run-dir: {tmp_path / 'extend'}\n")
    cfg = load_config([str(resolved), str(new_run)])
    ext = str(tmp_path / "extend")
    assert paths(cfg) == (ext, f"{ext}/checkpoints", f"{ext}/checkpoints", f"{ext}/tensorboard", f"{ext}/logs")
    assert outside_run_dir(cfg) is None
    chosen = tmp_path / "chosen.yml"
    chosen.write_text(f"run-dir: {ext}\ntensorboard-dir: {tmp_path / 'tb'}\n")
    cfg = load_config([str(resolved), str(chosen)])
    assert cfg.logging.tensorboard_dir == str(tmp_path / "tb")
    assert f"tensorboard-dir {tmp_path / 'tb'} is outside run-dir" in outside_run_dir(cfg)
