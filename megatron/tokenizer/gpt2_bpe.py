"""GPT2BPETokenizer: GPT-2's byte-level BPE from vocab.json + merges.txt, or from a .tiktoken file.

vocab.json/merges.txt go through the `tokenizers` ByteLevel BPE (the GPT-2 regex and byte
alphabet); a vocab-file ending in .tiktoken is delegated to tiktoken with the GPT-2 regex.
"""
from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from megatron.tokenizer.base import AbstractTokenizer, require_file
from megatron.tokenizer.tiktoken_bpe import EOD_TOKEN, TiktokenTokenizer


class GPT2BPETokenizer(AbstractTokenizer):
    name = "GPT2BPETokenizer"

    def __new__(cls, vocab_file: str, merge_file: str | None = None):
        if vocab_file and str(vocab_file).endswith(".tiktoken"):
            return TiktokenTokenizer(vocab_file, force_gpt2=True, name=cls.name)
        return super().__new__(cls)

    def __init__(self, vocab_file: str, merge_file: str | None = None):
        self._init_args = (vocab_file, merge_file)
        require_file(vocab_file, "vocab-file", self.name, "GPT-2 vocab.json (or a .tiktoken rank file)")
        require_file(merge_file, "merge-file", self.name, "GPT-2 merges.txt")
        try:
            with open(vocab_file, encoding="utf-8") as f:
                self.encoder = json.load(f)
            bpe = models.BPE.from_file(vocab_file, merge_file)
        except Exception as e:  # bad JSON or a malformed merges line
            raise ValueError(f"{self.name}: could not load vocab-file {vocab_file!r} / merge-file {merge_file!r} "
                             f"as GPT-2 vocab.json + merges.txt ({e})") from e
        if EOD_TOKEN not in self.encoder:
            raise ValueError(f"{self.name}: vocab-file {vocab_file!r} has no {EOD_TOKEN} entry; use GPT-2's vocab.json")
        self.tokenizer = Tokenizer(bpe)
        self.tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self.tokenizer.decoder = decoders.ByteLevel()

    @property
    def vocab_size(self) -> int:
        return len(self.encoder)

    @property
    def eod(self) -> int:
        return self.encoder[EOD_TOKEN]

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(texts)]

    def detokenize(self, ids) -> str:
        return self.tokenizer.decode(list(map(int, ids)))
