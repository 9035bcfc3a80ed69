"""HFTokenizer: a Hugging Face `tokenizers` JSON file (e.g. the GPT-NeoX-20B tokenizer)."""
from __future__ import annotations

from tokenizers import Tokenizer

from megatron.tokenizer.base import AbstractTokenizer, require_file

EOD_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|padding|>"


class HFTokenizer(AbstractTokenizer):
    name = "HFTokenizer"

    def __init__(self, vocab_file: str):
        self._init_args = (vocab_file,)
        expected = "a Hugging Face tokenizers JSON file (tokenizer.json)"
        require_file(vocab_file, "vocab-file", self.name, expected)
        try:
            self.tokenizer = Tokenizer.from_file(vocab_file)
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"{self.name}: `vocab-file` = {vocab_file!r} is not {expected} ({e})") from e
        self._eod = self.tokenizer.token_to_id(EOD_TOKEN)
        if self._eod is None:
            raise ValueError(f"{self.name}: {vocab_file!r} has no {EOD_TOKEN} token; add it as a special token when training")
        self.pad = self.tokenizer.token_to_id(PAD_TOKEN)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()  # includes added tokens, like NeoX

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def detokenize(self, ids) -> str:
        # Keep special tokens (NeoX drops them) so that decode(encode(x)) == x holds exactly.
        return self.tokenizer.decode(list(map(int, ids)), skip_special_tokens=False)
