"""From the data section of the config to train/valid/test GPT datasets (NeoX sample counts)."""
from __future__ import annotations

import numpy as np

from megatron.data.gpt_dataset import GPTDataset, build_train_valid_test_datasets
from megatron.data.identity import check_tokenizer
from megatron.data.indexed import MMapIndexedDataset


def sample_counts(cfg, train_batch_size: int) -> tuple[int, int, int]:
    t = cfg.training
    train = t.train_iters * train_batch_size
    valid = (t.train_iters // t.eval_interval + 1) * t.eval_iters * train_batch_size
    test = t.eval_iters * train_batch_size
    return train, valid, test


def _single(paths: list[str] | None, key: str) -> str | None:
    if not paths:
        return None
    if len(paths) > 1:
        raise ValueError(f"{key} lists {len(paths)} datasets; blending several datasets is not "
                         "implemented yet: give one prefix per split (or use data-path with split)")
    return paths[0]


def _prefixes(d) -> tuple:
    """(train, valid, test) prefixes of the per-split keys (None where unset)."""
    return (_single(d.train_data_paths, "train-data-paths"),
            _single(d.valid_data_paths, "valid-data-paths"),
            _single(d.test_data_paths, "test-data-paths"))


def check_data_tokenizer(cfg) -> None:
    """Refuse data written by another tokenizer than the config's (identity.py), for every prefix
    training reads. The trainer calls it before building the engine (no heavy work first)."""
    d = cfg.data
    for prefix in [d.single_path] if d.single_path else _prefixes(d):
        if prefix:
            check_tokenizer(prefix, d)


def check_document_eod(cfg, build_tokenizer) -> None:
    """reset-attention-mask / reset-position-ids cut documents at the tokenizer's end-of-document
    token: a tokenizer that has none is refused naming the key (the dry run and the trainer both
    ask, before anything is written). `build_tokenizer`: the one factory (megatron.tokenizer);
    a tokenizer whose files are missing is left to the input checks, which name the file."""
    d = cfg.data
    if not (d.reset_attention_mask or d.reset_position_ids):
        return
    key = "reset_attention_mask" if d.reset_attention_mask else "reset_position_ids"
    try:
        eod = getattr(build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file), "eod", None)
        problem = None if isinstance(eod, int) else f"tokenizer-type {d.tokenizer_type} has no end-of-document id"
    except OSError:
        return
    except (ValueError, NotImplementedError) as e:
        problem = str(e)
    if problem:
        raise cfg.refusal([(key, f"documents end at the tokenizer's end-of-document token, and the tokenizer "
                            f"cannot give one ({problem}); use a tokenizer with one, or turn the document keys off")])


def build_datasets(cfg, train_batch_size: int, vocab_size: int | None = None):
    """Returns (train, valid, test) datasets; an entry is None when its sample count is 0.
    Samples holding token ids outside [0, vocab_size) are refused, naming the data file."""
    d, t, m = cfg.data, cfg.training, cfg.model
    counts = sample_counts(cfg, train_batch_size)
    val_len = t.seq_length_val or m.seq_length
    check_data_tokenizer(cfg)
    if d.single_path:
        return build_train_valid_test_datasets(
            d.single_path, d.split, m.seq_length, t.seed, num_samples=counts,
            seq_length_val=t.seq_length_val, cache_dir=d.data_cache_dir, vocab_size=vocab_size,
        )
    prefixes = _prefixes(d)
    if not any(prefixes):
        raise ValueError("no training data configured: set `data-path` (one prefix, split by `split`) "
                         "or `train-data-paths`/`valid-data-paths`/`test-data-paths`; "
                         "`make quickstart` shows a working example (configs/quickstart.yml)")
    out = []
    for name, prefix, n, length in zip(("train", "valid", "test"), prefixes, counts, (m.seq_length, val_len, val_len)):
        if prefix is None or n == 0:
            out.append(None)
            continue
        indexed = MMapIndexedDataset(prefix)
        docs = np.arange(len(indexed), dtype=np.int32)
        out.append(GPTDataset(name, prefix, docs, indexed, n, length, t.seed, cache_dir=d.data_cache_dir,
                              vocab_size=vocab_size))
    return tuple(out)
