"""Build a ready-to-train corpus offline: documents -> jsonl.zst -> BPE tokenizer -> .bin/.idx.

    python tools/prepare_data.py stdlib --data-dir data --vocab-size 8192
    # -> data/stdlib/{stdlib.jsonl.zst, tokenizer.json, stdlib_text_document.bin/.idx}
    # train with: data-path data/stdlib/stdlib_text_document, tokenizer-type HFTokenizer,
    #             vocab-file data/stdlib/tokenizer.json

Steps whose outputs already exist (built with the same options) are skipped; --force rebuilds.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from anywhere

from megatron.data.corpora import CORPORA
from megatron.data.corpora.prepare import prepare_corpus


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", choices=sorted(CORPORA), help="which corpus to build")
    p.add_argument("--data-dir", default="data", help="outputs go to DATA_DIR/<corpus>/")
    p.add_argument("--vocab-size", type=int, default=8192, help="BPE vocabulary size, special tokens included")
    p.add_argument("--max-mb", type=float, default=None, help="stop collecting documents after this many MB of text")
    p.add_argument("--max-files", type=int, default=None, help="stop collecting documents after this many files")
    p.add_argument("--workers", type=int, default=1, help="tokenizer processes (1 = batched in-process, already multi-threaded)")
    p.add_argument("--force", action="store_true", help="rebuild every step even if its outputs exist")
    args = p.parse_args(argv)
    try:
        s = prepare_corpus(args.corpus, args.data_dir, args.vocab_size, args.max_mb, args.max_files, args.force, args.workers)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"{s['corpus']}: {s['files']} files, {s['mb']:.2f} MB, {s['documents']} documents, {s['tokens']} tokens, "
          f"vocab size {s['vocab_size']}, {s['seconds']:.1f}s")
    print(f"data-path {s['data_prefix']}  (tokenizer-type HFTokenizer, vocab-file {s['tokenizer']})")


if __name__ == "__main__":
    main()
