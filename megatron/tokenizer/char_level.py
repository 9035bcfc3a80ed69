"""CharLevelTokenizer: UTF-8 bytes as ids (NeoX's vocab of 512, eod 0, pad 1)."""
from __future__ import annotations

from megatron.tokenizer.base import AbstractTokenizer


class CharLevelTokenizer(AbstractTokenizer):
    name = "CharLevelTokenizer"

    def __init__(self, vocab_size: int = 512):
        self._init_args = (vocab_size,)
        self._vocab_size = vocab_size
        self.pad = 1

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eod(self) -> int:
        return 0

    def tokenize(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def detokenize(self, ids) -> str:
        # NeoX maps each id through chr(), which garbles multi-byte characters; decoding the
        # bytes keeps round trips exact. Ids >= 256 are not bytes and are dropped.
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")
