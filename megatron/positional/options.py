"""A positional scheme's own config keys, declared once beside the code that reads them.

A scheme class lists its hyperparameters as `options = (Option(...), ...)`: the key (the flat NeoX
name with underscores), its type, default, documentation and bounds. The model config composes its
fields from every scheme's declarations (megatron/config/model.py: `with_scheme_options`, which
reads them from the files without importing torch: megatron/config/scheme_options.py), so the
loader types and bounds-checks them, docs/config.md documents them and the HF export carries them,
with no second list; the scheme reads a value with `self.option(name)` (the spec's value, or the
declared default for a spec built outside the config: tests, tools).

Rules between several options (one must exceed another) are the scheme's `option_problems`,
which the model config's check runs whatever pos-emb is chosen, as it always did.

No torch here and relative imports only: the Hugging Face export ships this package's files."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    name: str  # the config key with underscores: xpos_scale_base
    type: Any  # int, float, str, bool, or `int | None` for an option whose None means "derive it"
    default: Any
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None
    # A None value stands for another model key's value (rotary-scaling-original-length: seq-length);
    # the model config writes the derived value out, so a resolved config states it.
    default_from: str | None = None

    def read(self, options: dict) -> Any:
        """This option's value in a spec's options (the model config's keys), or its default when
        the spec does not carry it."""
        value = options[self.name] if self.name in options else self.default
        if value is None and self.default_from is not None:
            value = options.get(self.default_from)
        return value


def declared_options(by_scheme: dict) -> dict[str, tuple[Option, list[str]]]:
    """{key: (option, the names of the schemes declaring it)} from {scheme name: its options}; a
    subclass inheriting its parent's options shares them (xpos reads rotary's rotary-pct). Two
    different declarations of one key are a mistake, refused here."""
    out: dict[str, tuple[Option, list[str]]] = {}
    for scheme_name, options in sorted(by_scheme.items()):
        for opt in options:
            known = out.get(opt.name)
            if known is None:
                out[opt.name] = (opt, [scheme_name])
            elif known[0] != opt:
                raise RuntimeError(f"positional option {opt.name!r} declared twice, differently "
                                   f"({', '.join(known[1])} and {scheme_name})")
            else:
                known[1].append(scheme_name)
    return out
