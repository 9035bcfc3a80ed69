"""JSON files that come from others (a downloaded model's config.json, a colleague's eval.json, a
checkpoint's manifest, a dataset's identity sidecar) nested thousands of levels deep: json has no
depth limit of its own and raised a RecursionError traceback; each reader now names the file."""
from __future__ import annotations

import pytest

from megatron.checkpoint.errors import CheckpointError
from megatron.errors import DataError, UserError

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_downloaded_models_config(tmp_path):
    from megatron.interop.hf_import import read_hf_config

    (tmp_path / "config.json").write_text(DEEP)
    with pytest.raises(UserError, match=r"config\.json is not readable as a JSON config: values nested .*RecursionError"):
        read_hf_config(str(tmp_path))


def test_an_evaluation_result(tmp_path):
    from megatron.evaluation.results import _read_json

    (tmp_path / "eval.json").write_text(DEEP)
    with pytest.raises(ValueError, match=r"eval\.json: not a readable JSON file .*pass only evaluate\.py's"):
        _read_json(str(tmp_path / "eval.json"))


def test_a_checkpoint_manifest(tmp_path):
    from megatron.checkpoint.manifest import MANIFEST, read_manifest

    (tmp_path / MANIFEST).write_text(DEEP)
    with pytest.raises(CheckpointError, match=r"is not readable as a checkpoint manifest: values nested"):
        read_manifest(str(tmp_path))


def test_a_dataset_identity(tmp_path):
    from megatron.data.identity import identity_path, read_identity

    prefix = str(tmp_path / "d_text_document")
    open(identity_path(prefix), "w").write(DEEP)
    with pytest.raises(DataError, match=r"is not a readable dataset identity"):
        read_identity(prefix)
