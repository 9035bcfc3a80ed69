"""Shared helpers for the benchmark tools (tools/bench_attention.py, tools/bench_train_step.py).

timing.py  -- device-synchronised median timing, peak-memory probes, error cells (OOM/error)
report.py  -- markdown tables, the device/environment header, rewriting one section of a doc
cli.py     -- argument checks that fail with the valid choices and exit code 2
corpus.py  -- a random-token corpus in the indexed format (the data path without a tokenizer)
"""
