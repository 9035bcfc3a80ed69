"""Datasets, split and tokenizer."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key
from megatron.tokenizer.types import NEOX_ONLY_TYPES, TOKENIZER_TYPES


def parse_split(split: str) -> list[float] | None:
    """'949,50,1' -> [949.0, 50.0, 1.0]; None when malformed. Missing parts count as 0 (NeoX)."""
    try:
        parts = [float(p) for p in split.replace("/", ",").split(",")]
    except ValueError:
        return None
    if not 1 <= len(parts) <= 3 or any(p < 0 for p in parts) or sum(parts) <= 0:
        return None
    return parts + [0.0] * (3 - len(parts))


@dataclass(frozen=True)
class DataConfig:
    data_path: str | None = key(
        None, "Prefix of one .bin/.idx dataset, split into train/valid/test by `split`.")
    train_data_paths: list[str] | None = key(
        None, "Training dataset prefixes; when set they take precedence over data-path, which is then unused (NeoX's "
        "rule; said at launch).")
    valid_data_paths: list[str] | None = key(None, "Validation dataset prefixes.")
    test_data_paths: list[str] | None = key(None, "Test dataset prefixes.")
    train_data_weights: list[float] | None = key(
        None, "Blend weights of train-data-paths; blending several datasets is not implemented (one "
        "prefix per split), so they change nothing.", inert=True)
    valid_data_weights: list[float] | None = key(
        None, "Blend weights of valid-data-paths; blending several datasets is not implemented (one "
        "prefix per split), so they change nothing.", inert=True)
    test_data_weights: list[float] | None = key(
        None, "Blend weights of test-data-paths; blending several datasets is not implemented (one "
        "prefix per split), so they change nothing.", inert=True)
    split: str = key("969, 30, 1", "Train, validation, test proportions of data-path's documents.")
    data_impl: str = key("infer", "Dataset format; only mmap (.bin/.idx) files are read, and infer "
                         "means mmap.", choices=("mmap", "infer", "cached", "lazy"), inert=True)
    tokenizer_type: str = key("GPT2BPETokenizer", "Tokenizer class.", choices=TOKENIZER_TYPES + NEOX_ONLY_TYPES)
    vocab_file: str | None = key(None, "Tokenizer vocabulary (GPT-2 vocab.json, HF tokenizer.json, "
                                 "SentencePiece model).")
    merge_file: str | None = key(None, "GPT-2 BPE merges file.")
    eod_mask_loss: bool = key(False, "Exclude end-of-document tokens from the loss.")
    reset_attention_mask: bool = key(
        False, "Megatron-LM's: in training, no token attends to a token of another document of its packed "
        "sequence (a document ends with its end-of-document token, which stays in it); evaluation and "
        "generation are unchanged. Every backend honours it (triton and flex skip tiles wholly across "
        "documents; sdpa skips the keys of earlier documents where that pays; flash runs each document as one "
        "sequence of flash_attn_varlen_func).")
    reset_position_ids: bool = key(
        False, "Megatron-LM's: in training, positions restart after each end-of-document token, so every "
        "scheme computes from positions within the document. Needs reset-attention-mask (here attention never "
        "crosses documents whose positions restarted).")
    pos_random_max_length: int | None = key(
        None, "Randomized positions (Ruoss et al., ACL 2023): each training sequence takes its own sorted positions "
        "drawn without replacement from [0, N), N this value (>= seq-length); evaluation uses consecutive "
        "positions. The draws are seeded by (seed, iteration, micro-step, rank) and the row: resume is exact. "
        "sdpa and reference backends.", gt=0)
    pos_skip_target_length: int | None = key(
        None, "PoSE (Zhu et al., ICLR 2024): each training sequence's positions are cut into pos-skip-chunks "
        "chunks at uniform points, chunk 0 at 0 and each later one shifted by a sorted uniform skip in "
        "[0, T - seq-length], T this value, so the distances reach T - 1; evaluation uses consecutive positions. "
        "Seeded like pos-random-max-length (exact resume). sdpa and reference backends.", gt=0)
    pos_skip_chunks: int = key(2, "PoSE's chunk count (the paper's default: 2), read with pos-skip-target-length.",
                               ge=1)
    mmap_warmup: bool = key(False, "NeoX: read the whole .bin once at start to warm the page cache; the "
                            ".bin is memory-mapped and read on demand here.", inert=True)
    use_shared_fs: bool = key(True, "NeoX: all nodes see the same filesystem; here run-dir and the data "
                              "must be on a shared filesystem for several nodes.", inert=True)
    data_cache_dir: str | None = key(
        None, "Where the sample-index .npy caches go; null = next to the data.")

    @property
    def single_path(self) -> str | None:
        """The one dataset `split` divides, or None: train-data-paths take precedence over data-path,
        as in NeoX (megatron/data/data_utils.py builds from train_data_paths when they are set), so
        NeoX's pythia/14M.yml on top of its local_setup.yml's data-path reads its own paths."""
        return None if self.train_data_paths else self.data_path

    def check(self) -> list[tuple[str, str]]:
        out = []
        if parse_split(self.split) is None:
            out.append(("split", "expected up to three non-negative numbers, e.g. \"949,50,1\""))
        for part in ("train", "valid", "test"):
            paths, weights = getattr(self, f"{part}_data_paths"), getattr(self, f"{part}_data_weights")
            if weights is not None and (paths is None or len(weights) != len(paths)):
                out.append((f"{part}_data_weights", f"needs one weight per {part}-data-paths entry"))
            elif weights is not None and (any(w < 0 for w in weights) or sum(weights) <= 0):
                out.append((f"{part}_data_weights", "weights must be >= 0 with a positive sum"))
        return out
