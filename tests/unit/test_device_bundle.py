"""tools/device_bundle.py (benchmarks/device_bundle.py): the lists of what the GPU image lacks stay true of this environment.
A pure-Python entry that grew a compiled extension would unpack on the device's Python 3.12 and
fail at import there, in the middle of scarce GPU time."""
import importlib.metadata as md

import pytest

from benchmarks import device_bundle


@pytest.mark.parametrize("name", device_bundle.PURE)
def test_pure_entries_have_no_compiled_code(name):
    files = device_bundle.installed_files(name)
    assert files, f"{name}: no installed files"
    compiled = [f for f in files if f.endswith((".so", ".pyd"))]
    assert not compiled, f"{name} ships compiled code ({compiled[:3]}): move it to COMPILED"


@pytest.mark.parametrize("name", device_bundle.COMPILED)
def test_compiled_entries_are_installed(name):
    assert md.version(name)


def test_data_travels_as_one_archive_at_the_paths_the_configs_name(tmp_path):
    import tarfile

    (tmp_path / "data" / "code").mkdir(parents=True)
    for ext in (".bin", ".idx", ".identity.json"):
        (tmp_path / "data" / "code" / f"code_text_document{ext}").write_bytes(b"x" * 10)
    (tmp_path / "data" / "code" / "tokenizer.json").write_text("{}")
    (tmp_path / "data" / "code" / "code_text_document_train_indexmap_1ns.npy").write_bytes(b"cache")  # rebuilt there
    out = tmp_path / "data.tar.xz"
    names = device_bundle.pack_data(["data/code/code_text_document", "data/code/tokenizer.json"], str(out),
                                    root=str(tmp_path))
    assert names == ["data/code/code_text_document.bin", "data/code/code_text_document.idx",
                     "data/code/code_text_document.identity.json", "data/code/tokenizer.json"]
    with tarfile.open(out) as tar:
        assert tar.getnames() == names


def test_data_that_is_not_there_is_one_message_and_nothing_written(tmp_path):
    from megatron.errors import UserError

    out = tmp_path / "data.tar.xz"
    with pytest.raises(UserError, match="neither a file nor a dataset prefix with .bin and .idx"):
        device_bundle.pack_data(["data/nope/nope_text_document"], str(out), root=str(tmp_path))
    with pytest.raises(UserError, match="outside the repository"):
        device_bundle.pack_data(["../elsewhere"], str(out), root=str(tmp_path))
    assert not out.exists()


def test_activate_unpacks_the_data_archive_when_there_is_one():
    assert "tar -xJf .device/data.tar.xz" in device_bundle.ACTIVATE
