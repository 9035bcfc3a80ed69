"""TiktokenTokenizer: a local `.tiktoken` rank file run through tiktoken's fast BPE.

We parse the file ourselves (one "base64(token) rank" per line) instead of calling
tiktoken.load, which may consult a cache directory or the network; nothing is downloaded.
"""
from __future__ import annotations

import base64
import os

import tiktoken

from megatron.tokenizer.base import AbstractTokenizer, require_file

EOD_TOKEN = "<|endoftext|>"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CL100K_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""  # noqa: E501
EXPECTED = "a .tiktoken rank file (base64 token + rank per line, e.g. gpt2.tiktoken from the openai-whisper sdist)"


def load_ranks(path: str, key: str, tokenizer_type: str) -> dict[bytes, int]:
    require_file(path, key, tokenizer_type, EXPECTED)
    ranks = {}
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token, validate=True)] = int(rank)
            except ValueError as e:
                raise ValueError(f"{tokenizer_type}: `{key}` = {path!r} line {lineno} is not "
                                 f"'base64 rank'; point it at {EXPECTED}") from e
    if not ranks:
        raise ValueError(f"{tokenizer_type}: `{key}` = {path!r} is empty; point it at {EXPECTED}")
    return ranks


def _layout(path: str, ranks: dict[bytes, int], force_gpt2: bool):
    """(regex, special tokens) for the file: cl100k if its name says so, else GPT-2 (r50k),
    whose <|endoftext|> id comes right after the last rank (50256 for GPT-2)."""
    if not force_gpt2 and "cl100k" in os.path.basename(path):
        specials = {EOD_TOKEN: 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                    "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}
        return CL100K_PATTERN, specials
    return GPT2_PATTERN, {EOD_TOKEN: max(ranks.values()) + 1}


class TiktokenTokenizer(AbstractTokenizer):
    name = "TiktokenTokenizer"

    def __init__(self, vocab_file: str, force_gpt2: bool = False, name: str | None = None):
        self._init_args = (vocab_file, force_gpt2, name)
        self.name = name or self.name  # GPT2BPETokenizer reuses this class under its own name
        ranks = load_ranks(vocab_file, "vocab-file", self.name)
        pattern, specials = _layout(vocab_file, ranks, force_gpt2)
        self.encoding = tiktoken.Encoding(name=os.path.basename(vocab_file), pat_str=pattern,
                                          mergeable_ranks=ranks, special_tokens=specials)
        self._eod = specials[EOD_TOKEN]

    @property
    def vocab_size(self) -> int:
        return self.encoding.n_vocab

    @property
    def eod(self) -> int:
        return self._eod

    def tokenize(self, text: str) -> list[int]:
        # "<|endoftext|>" inside a document is ordinary text, as in GPT-2's own encoder;
        # tiktoken would otherwise raise on it.
        return self.encoding.encode_ordinary(text)

    def tokenize_batch(self, texts: list[str]) -> list[list[int]]:
        return self.encoding.encode_ordinary_batch(texts, num_threads=2)

    def detokenize(self, ids) -> str:
        return self.encoding.decode(list(map(int, ids)))
