"""Tokenizers by their GPT-NeoX type names; `build_tokenizer` is the one entry point.

    tok = build_tokenizer("HFTokenizer", vocab_file="data/stdlib/tokenizer.json")
    ids = tok.tokenize("def f(): pass") + [tok.eod]
"""
from __future__ import annotations

from megatron.tokenizer.base import AbstractTokenizer
from megatron.tokenizer.char_level import CharLevelTokenizer
from megatron.tokenizer.types import TOKENIZER_TYPES

__all__ = ["TOKENIZER_TYPES", "AbstractTokenizer", "build_tokenizer", "padded_vocab_size"]


def build_tokenizer(tokenizer_type: str, vocab_file: str | None = None, merge_file: str | None = None) -> AbstractTokenizer:
    # Each class with a third-party library is imported when asked for: the package (and so the
    # config, which reads TOKENIZER_TYPES) must not load tiktoken, tokenizers and sentencepiece up front.
    if tokenizer_type == "GPT2BPETokenizer":
        from megatron.tokenizer.gpt2_bpe import GPT2BPETokenizer  # lazy: tokenizers, tiktoken
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "HFTokenizer":
        from megatron.tokenizer.hf import HFTokenizer  # lazy: tokenizers
        return HFTokenizer(vocab_file)
    if tokenizer_type == "TiktokenTokenizer":
        from megatron.tokenizer.tiktoken_bpe import TiktokenTokenizer  # lazy: tiktoken
        return TiktokenTokenizer(vocab_file)
    if tokenizer_type == "SPMTokenizer":
        from megatron.tokenizer.spm import SPMTokenizer  # lazy: sentencepiece
        return SPMTokenizer(vocab_file)
    if tokenizer_type == "CharLevelTokenizer":
        return CharLevelTokenizer(512)
    if tokenizer_type == "HFGPT2Tokenizer":  # NeoX type that downloads "gpt2" from the HF hub
        raise ValueError("tokenizer-type HFGPT2Tokenizer needs a download, which this stack never does; use "
                         "GPT2BPETokenizer with vocab-file pointing at gpt2.tiktoken (or vocab.json + merge-file merges.txt)")
    raise ValueError(f"unknown tokenizer-type {tokenizer_type!r}; choose one of {', '.join(TOKENIZER_TYPES)}")


def padded_vocab_size(vocab_size: int, make_vocab_size_divisible_by: int = 128, model_parallel_size: int = 1) -> int:
    """Round the vocab up so the embedding splits evenly over model-parallel ranks (NeoX)."""
    multiple = make_vocab_size_divisible_by * model_parallel_size
    if multiple <= 0:
        raise ValueError(f"make-vocab-size-divisible-by x model-parallel-size must be positive, got {multiple}")
    return -(-vocab_size // multiple) * multiple
