"""The config reads the positional schemes' own options from their files without importing them
(megatron/config/scheme_options.py): what it reads must be exactly what the imported classes
declare, and a declaration it cannot read is refused with its file and line."""
from __future__ import annotations

import pytest

import megatron.positional as positional_package
from megatron.attention.registry import backend_classes
from megatron.config.backend_names import backend_names
from megatron.config.scheme_options import scheme_names, scheme_options
from megatron.positional import registry
from megatron.positional.options import Option


def test_read_from_the_files_equals_the_imported_declarations():
    read = scheme_options()
    assert read == registry.scheme_options() and scheme_names() == registry.scheme_names()
    assert backend_names() == list(backend_classes())  # attention-backend's choices, the same way
    # the shapes the files use: a literal in the class (rpe), module-level names (xpos), a tuple
    # imported under another name and starred (rotary's scaling), inheritance (xpos from rotary)
    assert read["rpe_num_buckets"][0] == Option("rpe_num_buckets", int, 32, read["rpe_num_buckets"][0].doc, ge=1)
    assert read["rotary_pct"][1] == ["rotary", "xpos"] and read["rotary_scaling"][1] == ["rotary"]
    assert read["rotary_scaling"][0].choices == ("none", "linear", "ntk", "dynamic", "yarn", "llama3")
    assert read["sandwich_dim"][0].type == (int | None)


def _package(tmp_path, source: str) -> list[str]:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "mine.py").write_text(source, encoding="utf-8")
    return [*positional_package.__path__, str(extra)]


def test_a_new_file_is_read_with_the_options_it_inherits(tmp_path):
    dirs = _package(tmp_path, "from .options import Option\nfrom .registry import register\n"
                              "from .rotary import RotaryPositions\n\n\n"
                              "@register('mine')\nclass Mine(RotaryPositions):\n    pass\n")
    read = scheme_options(dirs)
    assert "mine" in read["rotary_yarn_beta_fast"][1] and read["rotary_pct"][1] == ["mine", "rotary", "xpos"]


def test_an_option_computed_at_import_is_refused_with_file_and_line(tmp_path):
    dirs = _package(tmp_path, "import math\n\nfrom .options import Option\nfrom .registry import register\n"
                              "from .base import PositionalScheme\n\n\n@register('mine')\n"
                              "class Mine(PositionalScheme):\n"
                              "    options = (Option('mine_scale', float, math.sqrt(2.0), 'doc'),)\n")
    with pytest.raises(ValueError, match=r"mine\.py:10: cannot read 'math\.sqrt\(2\.0\)' without running the file; "
                                         r"a positional scheme's options must be literal declarations"):
        scheme_options(dirs)


def test_one_key_declared_twice_differently_is_refused(tmp_path):
    dirs = _package(tmp_path, "from .options import Option\nfrom .registry import register\n"
                              "from .base import PositionalScheme\n\n\n@register('mine')\n"
                              "class Mine(PositionalScheme):\n"
                              "    options = (Option('xpos_gamma', float, 0.5, 'another default'),)\n")
    with pytest.raises(RuntimeError, match="positional option 'xpos_gamma' declared twice, differently"):
        scheme_options(dirs)
