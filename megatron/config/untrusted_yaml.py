"""YAML from elsewhere (configs from colleagues and papers' repositories, -o values, lm-eval task
files) read with limits, so a hostile or broken file is refused in one line before it costs memory.

A 450-byte file of nested anchors (a "billion laughs": nine aliases of nine aliases of ...)
composes into a few dozen nodes, but anything that walks the values (printing the settings,
validating, writing resolved_config.yml) visits 9^9 of them; a value nested a few thousand levels
deep overflows PyYAML's recursive composer. Both are measured while composing, before any value
is built:

- a file over MAX_BYTES is not read past the limit;
- nesting deeper than MAX_DEPTH is refused at the first node past it;
- every node's size once its aliases are expanded is summed as it is composed (an alias costs
  the size of the node it names), and the first one past MAX_VALUES is refused; an alias inside
  its own anchor (a recursive value) is refused too.

Real configs are far inside the limits: NeoX's largest is 3 KiB, 4 levels and a few hundred
values (tests/unit/test_untrusted_yaml.py loads every YAML file of the repository). The semantics
are yaml.safe_load's: no Python tags.
"""
from __future__ import annotations

import yaml

from megatron.errors import UserError

MAX_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 100  # nested collections; PyYAML's composer needs ~3 Python frames a level
MAX_VALUES = 100_000  # scalars, lists and mappings, aliases expanded

LIMITS_NOTE = "YAML is read with limits: docs/launching.md"


class YamlLimitError(UserError):
    """A YAML text over one of the limits; the message names the source and the limit."""


def _where(source: str, mark) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source


class LimitedSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader within the limits (pure Python: libyaml's C composer cannot be overridden).
    `source` ("config file x.yml") names the refusals."""

    def __init__(self, stream, source: str = "YAML text"):
        check_size(stream, source)
        super().__init__(stream)
        self.source = source
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its size once aliases are expanded

    def _too_deep(self, mark) -> YamlLimitError:
        return YamlLimitError(f"{_where(self.source, mark)}: values nested more than {MAX_DEPTH} levels deep "
                              f"(the limit; {LIMITS_NOTE}): flatten them")

    # The scanner looks ahead over every open `[` / `{` (each could start a key), so flow nesting
    # is counted there, before it costs time; block nesting (`- - - x`) likewise.
    def fetch_flow_collection_start(self, TokenClass):
        if self.flow_level >= MAX_DEPTH:
            raise self._too_deep(self.get_mark())
        super().fetch_flow_collection_start(TokenClass)

    def add_indent(self, column):
        if len(self.indents) >= MAX_DEPTH:
            raise self._too_deep(self.get_mark())
        return super().add_indent(column)

    def compose_node(self, parent, index):
        if self._depth >= MAX_DEPTH:
            raise self._too_deep(self.peek_event().start_mark)
        alias = self.peek_event() if self.check_event(yaml.AliasEvent) else None
        self._depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if alias is not None:  # the node it names is sized already, unless the alias is inside it
            if id(node) not in self._sizes:
                raise YamlLimitError(f"{_where(self.source, alias.start_mark)}: the alias *{alias.anchor} is inside "
                                     f"its own anchor &{alias.anchor} (a value that contains itself): write it out")
            return node
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._sizes[id(child)] for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        else:
            size = 1
        if size > MAX_VALUES:
            raise YamlLimitError(f"{_where(self.source, node.start_mark)}: more than {MAX_VALUES:,} values, an alias "
                                 f"(*name) counting as all the values it repeats (the limit; {LIMITS_NOTE}): nested "
                                 "anchors (a \"billion laughs\")? write the values out")
        self._sizes[id(node)] = size
        return node


def check_size(text, source: str) -> None:
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"{source} is over {MAX_BYTES >> 20} MiB (the limit; {LIMITS_NOTE}): "
                             "is it the file you meant?")


def read_bounded(path: str, source: str) -> bytes:
    """The file's bytes, reading at most one byte past the limit (a multi-GiB file or a device is
    refused without reading it whole). OSError as open() raises it."""
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    check_size(raw, source)
    return raw


def safe_load(text: str, source: str):
    """yaml.safe_load within the limits; YamlLimitError names `source`."""
    loader = LimitedSafeLoader(text, source)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def check_file(path: str, source: str):
    """The first document's composed root node (None if there is none, or the text is not valid
    YAML); YamlLimitError if the file is over a limit. Syntax errors and tags are left to the
    program that reads the file (lm-eval defines `!function`), so nothing is constructed here."""
    text = read_bounded(path, source).decode("utf-8", errors="replace")
    loader = LimitedSafeLoader(text, source)
    root = None
    try:
        while loader.check_node():
            node = loader.get_node()
            root = node if root is None else root
    except yaml.YAMLError:
        pass
    finally:
        loader.dispose()
    return root
