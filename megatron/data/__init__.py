"""Data pipeline: MMIDIDX indexed datasets, GPT sample indexing, preprocessing and bundled corpora."""
