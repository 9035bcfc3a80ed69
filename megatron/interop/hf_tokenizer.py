"""The tokenizer files of a Hugging Face model directory, as untrusted input: read with a size
limit, parsed once (one message naming the file when it does not parse), and their vocabulary held
against the embedding's rows before the import writes anything.

    tokenizer.json   -> HFTokenizer    (Hugging Face `tokenizers`)
    tokenizer.model  -> SPMTokenizer   (sentencepiece; Llama's, when no tokenizer.json is beside it)

A tokenizer smaller than the embedding is normal (Pythia's 50,277 tokens in 50,304 rows padded to a
multiple of 128); a larger one produces ids past the embedding's last row (generate.py ended in an
IndexError), so it is refused. No tokenizer at all is recorded as such (client state
`tokenizer: None`), so generate.py asks for one instead of reading GPT-2's vocab.json.
"""
from __future__ import annotations

import os

from megatron.errors import UserError

TOKENIZER_DIR = "tokenizer"
MAX_TOKENIZER_BYTES = 128 << 20  # the largest Hub tokenizer.json files are ~35 MiB
KINDS = (("tokenizer.json", "HFTokenizer"), ("tokenizer.model", "SPMTokenizer"))


def find_tokenizer(hf_dir: str) -> tuple[str, str] | None:
    """(file path, tokenizer-type) of the tokenizer in `hf_dir`, tokenizer.json first; None without one."""
    for name, kind in KINDS:
        path = os.path.join(hf_dir, name)
        if os.path.isfile(path):
            return path, kind
    return None


def token_count(path: str, kind: str) -> int:
    """How many ids the tokenizer can produce (its largest id + 1, added tokens included)."""
    fix = "download or copy it again, or move it out of the directory to import without a tokenizer"
    with open(path, "rb") as f:
        raw = f.read(MAX_TOKENIZER_BYTES + 1)
    if len(raw) > MAX_TOKENIZER_BYTES:
        raise UserError(f"{path} is over {MAX_TOKENIZER_BYTES >> 20} MiB, far more than a tokenizer holds (the "
                        f"limit): is it the file you meant? {fix}")
    try:
        if kind == "HFTokenizer":
            from tokenizers import Tokenizer  # lazy: only the library of the tokenizer file found

            ids = Tokenizer.from_str(raw.decode("utf-8")).get_vocab(with_added_tokens=True).values()
            return max(ids, default=-1) + 1
        import sentencepiece as spm  # lazy: as above

        sp = spm.SentencePieceProcessor()
        sp.LoadFromSerializedProto(raw)
        return sp.get_piece_size()
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception, sentencepiece RuntimeError
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        what = "a Hugging Face tokenizers JSON file" if kind == "HFTokenizer" else "a sentencepiece model"
        raise UserError(f"{path} is not readable as {what} ({first}); {fix}") from None


def check_vocab(path: str, count: int, rows: int, embedding: str) -> str:
    """Refuse a tokenizer with ids past the embedding's rows; returns the line saying how they compare."""
    if count > rows:
        raise UserError(f"{path} has {count:,} token ids but the embedding has {rows:,} rows ({embedding}): ids "
                        f"from {rows:,} on would index past it, so this tokenizer is not the model's. Put the "
                        f"model's own tokenizer beside config.json, or import without one: mv {path} "
                        f"{path}.not-this-model, then run the same import again")
    if count < rows:
        return (f"tokenizer: {count:,} tokens; the embedding's {rows:,} rows include {rows - count:,} no token "
                "produces (padding, as released models round their vocabulary up)")
    return f"tokenizer: {count:,} tokens, one per row of the embedding"


def tokenizer_keys(found: tuple[str, str] | None, output_dir: str) -> tuple[dict, dict]:
    """(NeoX tokenizer keys, {file under the output: source}) for the tokenizer found; the config
    names the copy beside the checkpoint by its absolute path (configs are read from any working
    directory). None found: no keys (pre-tokenized data still evaluates; the client state says so)."""
    if found is None:
        return {}, {}
    path, kind = found
    rel = os.path.join(TOKENIZER_DIR, os.path.basename(path))
    return ({"tokenizer-type": kind, "vocab-file": os.path.join(os.path.abspath(output_dir), rel)}, {rel: path})
