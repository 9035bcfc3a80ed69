"""Train a GPT-2-style byte-level BPE with HF `tokenizers` and save it as a tokenizer.json
that HFTokenizer loads. <|endoftext|> is id 0 and <|padding|> id 1, the GPT-NeoX-20B layout."""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from megatron.atomic_io import atomic_output

SPECIAL_TOKENS = ("<|endoftext|>", "<|padding|>")


def train_bytelevel_bpe(texts: Iterable[str], vocab_size: int, out_path: str, min_frequency: int = 2,
                        length: int | None = None) -> Tokenizer:
    """Train on `texts` (one string per document) and atomically write `out_path`.

    No normalizer, so decode(encode(x)) == x for any text, newlines and indentation included.
    The trainer counts pairs exactly and breaks ties deterministically, so the same texts in
    the same order give the same file.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab-size {vocab_size} is too small for a byte-level BPE; use at least {256 + len(SPECIAL_TOKENS)}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    with atomic_output(out_path) as tmp:  # a tokenizer, like a dataset, is published whole or not at all
        tokenizer.save(tmp)
    return tokenizer
