"""A random-token corpus in the indexed format (.bin/.idx) for benchmarks that run the real data
path without a tokenizer or a downloaded corpus: tools/gpu_throughput.py (deepy.py on the paper's
config) and tools/bench_data_loader.py (the loader alone)."""
from __future__ import annotations

import numpy as np

from megatron.data.indexed import MMapIndexedDatasetBuilder

VOCAB = 50304  # GPT-2's 50,257 padded to a multiple of 128, as NeoX pads it


def write_corpus(prefix: str, tokens: int, vocab: int, seed: int = 0) -> str:
    """At least `tokens` random ids in [1, vocab) at prefix.bin/.idx, as documents of 1,024 tokens
    whose last one is an end-of-document (0). Returns the prefix."""
    rng = np.random.default_rng(seed)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", np.uint16)
    for _ in range(max(1, -(-tokens // 1024))):
        doc = rng.integers(1, vocab, 1024)
        doc[-1] = 0
        builder.add_item(doc)
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix
