"""Packed-document masking against the unmasked step: `python tools/bench_document_mask.py --help`;
the tool is benchmarks/bench_document_mask.py."""
from benchmarks.bench_document_mask import main

if __name__ == "__main__":
    main()
