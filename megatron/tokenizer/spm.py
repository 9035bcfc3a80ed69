"""SPMTokenizer: a sentencepiece model file."""
from __future__ import annotations

import sentencepiece as spm

from megatron.tokenizer.base import AbstractTokenizer, require_file

EOD_PIECE = "<|endoftext|>"


class SPMTokenizer(AbstractTokenizer):
    name = "SPMTokenizer"

    def __init__(self, vocab_file: str):
        self._init_args = (vocab_file,)
        expected = "a sentencepiece model file (*.model)"
        require_file(vocab_file, "vocab-file", self.name, expected)
        try:
            self.sp = spm.SentencePieceProcessor(model_file=vocab_file)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError on a bad file
            raise ValueError(f"{self.name}: `vocab-file` = {vocab_file!r} is not {expected} ({e})") from e
        self._eod = self._find_eod(vocab_file)

    def _find_eod(self, vocab_file: str) -> int:
        piece_id = self.sp.piece_to_id(EOD_PIECE)  # returns unk_id when the piece is absent
        if self.sp.id_to_piece(piece_id) == EOD_PIECE:
            return piece_id
        if self.sp.eos_id() >= 0:
            return self.sp.eos_id()
        raise ValueError(f"{self.name}: {vocab_file!r} has neither a {EOD_PIECE} piece nor an eos id; "
                         f"retrain it with user_defined_symbols=['{EOD_PIECE}'] or eos_id >= 0")

    @property
    def vocab_size(self) -> int:
        return self.sp.get_piece_size()

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self.sp.encode(text, out_type=int)

    def detokenize(self, ids) -> str:
        return self.sp.decode(list(map(int, ids)))
