"""What every tokenizer offers the rest of the stack, plus the vocab-file checks they share."""
from __future__ import annotations

import os


class AbstractTokenizer:
    """vocab_size, eod (end-of-document id), tokenize(text) -> ids, detokenize(ids) -> text.

    Subclasses remember their constructor arguments in `_init_args` so that pickling (e.g. into
    multiprocessing workers) rebuilds the tokenizer from its files instead of pickling native
    objects, which not every backend supports.
    """

    name = "AbstractTokenizer"
    _init_args: tuple = ()

    def __reduce__(self):
        return (type(self), self._init_args)

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def eod(self) -> int:
        raise NotImplementedError

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        """Backends with a fast batched encoder override this."""
        return [self.tokenize(t) for t in texts]

    def detokenize(self, ids) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod})"


def require_file(path: str | None, key: str, tokenizer_type: str, expected: str) -> str:
    """Return `path` if it is a readable file, else raise a ValueError saying which key to fix."""
    if not path:
        raise ValueError(f"{tokenizer_type} needs `{key}` set to {expected}; it is not set")
    if not os.path.isfile(path) or not os.access(path, os.R_OK):
        raise ValueError(f"{tokenizer_type}: `{key}` = {path!r} is not a readable file; point it at {expected}")
    return path
