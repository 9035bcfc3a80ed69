"""Tokenize a corpus into GPT-NeoX's mmap indexed format (same CLI as NeoX's preprocess_data.py).

    python tools/preprocess_data.py --input data/stdlib/stdlib.jsonl.zst \
        --tokenizer-type HFTokenizer --vocab-file data/stdlib/tokenizer.json \
        --append-eod --output-prefix data/stdlib/stdlib
    # -> data/stdlib/stdlib_text_document.{bin,idx}
"""
from __future__ import annotations

import argparse
import signal

from megatron.cli_args import ArgumentParser, int_at_least
from megatron.data.preprocess import preprocess
from megatron.errors import DataError, UserError
from megatron.tokenizer import build_tokenizer
from megatron.tokenizer.types import NEOX_ONLY_TYPES, TOKENIZER_TYPES


def get_args(argv=None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("input data")
    g.add_argument("--input", required=True,
                   help="comma-separated files or directories (.jsonl, .jsonl.zst, .txt, ... as lm_dataformat reads)")
    g.add_argument("--jsonl-keys", nargs="+", default=["text"],
                   help="names the output files; text is read from 'text' (as in NeoX)")
    g.add_argument("--num-docs", type=int_at_least(1), default=None, help="stop after this many documents")
    g = p.add_argument_group("tokenizer")
    g.add_argument("--tokenizer-type", required=True, choices=TOKENIZER_TYPES + NEOX_ONLY_TYPES)
    g.add_argument("--vocab-file", default=None)
    g.add_argument("--merge-file", default=None)
    g.add_argument("--append-eod", action="store_true", help="append the end-of-document token to every document")
    g.add_argument("--ftfy", action="store_true", help="fix unicode with ftfy first (needs ftfy installed)")
    g = p.add_argument_group("output data")
    g.add_argument("--output-prefix", required=True)
    g.add_argument("--dataset-impl", default="mmap", choices=["lazy", "cached", "mmap"])
    g.add_argument("--overwrite", action="store_true",
                   help="replace a dataset that already exists at the output prefix (refused otherwise)")
    g = p.add_argument_group("runtime")
    g.add_argument("--workers", type=int_at_least(1), default=1)
    g.add_argument("--log-interval", type=int_at_least(0), default=100, help="documents between progress lines (0 = none)")
    return p.parse_args(argv)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C, so the dataset's temporaries are removed


def main(argv=None) -> int:
    args = get_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if args.dataset_impl != "mmap":
        raise DataError(f"--dataset-impl {args.dataset_impl} is not supported (legacy format); use --dataset-impl mmap")
    try:
        tokenizer = build_tokenizer(args.tokenizer_type, args.vocab_file, args.merge_file)
    except ValueError as e:  # the tokenizers' own messages already name the file and the fix
        raise e if isinstance(e, UserError) else UserError(str(e)) from e
    for key in args.jsonl_keys:
        stats = preprocess(args.input, tokenizer, args.output_prefix, key=key, append_eod=args.append_eod,
                           num_docs=args.num_docs, workers=args.workers, log_interval=args.log_interval,
                           ftfy=args.ftfy, overwrite=args.overwrite)
        print(f"wrote {stats['prefix']}.{{bin,idx}}: {stats['documents']} documents, {stats['tokens']} tokens "
              f"({stats['dtype']}) in {stats['seconds']:.1f}s = {stats['docs_per_s']:.1f} docs/s")
    return 0
