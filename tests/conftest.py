"""Shared fixtures: tiny configs and tiny real-format datasets, all on CPU."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(ROOT, ".venv", "torch_extensions"))
os.environ.setdefault("WANDB_MODE", "disabled")
# evaluate.py draws its PNGs by default (seconds of matplotlib per call); the suite runs it dozens of
# times, so here --no-plots is the default and tests/integration/test_evaluate_plots.py asks for them.
os.environ.setdefault("KERPLE_EVAL_PLOTS", "0")
# Without a GPU the Triton kernels run in Triton's interpreter on CPU tensors; this must be set
# before anything imports triton (megatron/attention/kernels read it when their kernels are defined).
if not __import__("torch").cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# The suite is about CPU behaviour unless a test says otherwise: DS_ACCELERATOR=cpu (set above) makes
# every `device: auto` / `--device auto` the CPU, on a GPU machine too (megatron/device.py). Tests of
# the Triton kernels put their tensors on KERNEL_DEVICE: compiled on the GPU when there is one, else
# Triton's interpreter on CPU tensors (it cannot run both ways in one process). Tests of the GPU
# path carry the `gpu` marker (tests/gpu/, `make test-gpu`) and ask for `device: cuda` themselves.
KERNEL_DEVICE = __import__("torch").device("cuda" if __import__("torch").cuda.is_available() else "cpu")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA; `make test-gpu` runs these (skipped without a GPU)")


def skip_reason(report) -> str:
    """Why a test was skipped, as its skip said it (pytest's "Skipped: " prefix dropped); a test
    marked `gpu` skipped on a machine without CUDA says so first, whatever its own words."""
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ")
    if "gpu" in getattr(report, "keywords", {}) and not KERNEL_DEVICE.type == "cuda":
        return f"no GPU on this machine (`make test-gpu` runs it on one): {reason}"
    return reason


def pytest_terminal_summary(terminalreporter):
    """One line per skip reason with its count, so a skip for a missing GPU reads apart from one for
    a missing dependency (`-q` alone prints only the total)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    counts: dict[str, int] = {}
    for report in skipped:
        reason = skip_reason(report)
        counts[reason] = counts.get(reason, 0) + 1
    terminalreporter.write_sep("-", f"{len(skipped)} skipped, by reason")
    for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:4d}  {reason}")

TINY_MODEL = {
    "num-layers": 2, "hidden-size": 32, "num-attention-heads": 4, "seq-length": 32,
    "max-position-embeddings": 32, "pos-emb": "kerple_log", "no-weight-tying": True,
    "padded-vocab-size": 128, "train-iters": 0, "train_micro_batch_size_per_gpu": 2,
}


def checkpoint_layout(path, step: int = 4) -> str:
    """An empty checkpoint directory (`latest` naming global_step<step>/) for tests that stand in
    for the loader: the CLIs check the layout before torch loads (tests/integration/test_cli_fast_answers.py)."""
    os.makedirs(os.path.join(path, f"global_step{step}"), exist_ok=True)
    with open(os.path.join(path, "latest"), "w") as f:
        f.write(f"global_step{step}")
    return str(path)


def reseal_manifest(tag_dir: str) -> None:
    """After a test edits a saved step's file: rewrite the step's manifest, as if it had been saved
    that way (the manifest itself refuses any edit: megatron/checkpoint/manifest.py)."""
    from megatron.checkpoint.manifest import read_manifest, write_manifest

    record = read_manifest(tag_dir)
    write_manifest(tag_dir, record["tag"], record["layout"], (record["config"] or {}).get("model"),
                   record["iteration"])


def deepy_exit(monkeypatch, capsys, config: str) -> tuple[int, str]:
    """`python deepy.py train.py CONFIG` in this process, as a user sees it: (exit code, stderr)."""
    import sys

    from megatron import errors
    from megatron.launch import launcher

    monkeypatch.delenv(errors.DEBUG_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["deepy.py", "train.py", config])
    with pytest.raises(SystemExit) as e:
        errors.run_cli(launcher.main, "deepy.py")
    return e.value.code, capsys.readouterr().err


def write_yaml(path, data: dict) -> str:
    """Atomically: the ranks of a multi-process test each write the same file, and one must never
    read another's half-written copy."""
    from megatron.atomic_io import atomic_output

    with atomic_output(str(path), fsync=False) as tmp, open(tmp, "w") as f:
        yaml.safe_dump(data, f)
    return str(path)


@pytest.fixture
def tiny_config(tmp_path):
    """Factory: tiny_config(**flat_overrides) -> NeoXConfig (model only, no data)."""
    from megatron.config import load_config

    def make(**over):
        data = dict(TINY_MODEL)
        data["run-dir"] = str(tmp_path / "run")  # derived paths (TensorBoard, W&B) stay in tmp_path
        data.update({k.replace("_", "-"): v for k, v in over.items()})
        return load_config([write_yaml(tmp_path / "tiny.yml", data)])

    return make


def write_token_dataset(prefix: str, num_docs: int = 200, vocab: int = 120, seed: int = 0,
                        eod: int = 0) -> str:
    """A learnable synthetic corpus in the real .bin/.idx format: each document counts up mod
    the vocab with its own stride (1-3), so even a bigram model drops from ln(vocab) to ~ln(3)."""
    from megatron.data.indexed import MMapIndexedDatasetBuilder

    rng = np.random.RandomState(seed)
    builder = MMapIndexedDatasetBuilder(prefix + ".bin", np.uint16)
    for _ in range(num_docs):
        start, stride, n = rng.randint(1, vocab), rng.randint(1, 4), rng.randint(30, 120)
        doc = np.concatenate([1 + (start + stride * np.arange(n)) % (vocab - 1), [eod]])
        builder.add_item(doc.astype(np.int64))
        builder.end_document()
    builder.finalize(prefix + ".idx")
    return prefix


@pytest.fixture
def token_dataset(tmp_path):
    return write_token_dataset(str(tmp_path / "tiny_text_document"))


def train_config_dict(tmp_path, data_prefix: str, **over) -> dict:
    data = dict(TINY_MODEL)
    data.update({
        "data-path": data_prefix, "split": "80,10,10", "data-impl": "mmap",
        "tokenizer-type": "CharLevelTokenizer",
        "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.99], "eps": 1e-8}},
        "train-iters": 6, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
        "eval-interval": 1000, "eval-iters": 2, "lr-decay-style": "cosine", "warmup": 0.1,
        "log-interval": 1, "num-workers": 0, "progress-bar": False,
        "run-dir": str(tmp_path / "run"), "seed": 1234, "device": "cpu",
    })
    data.update({k.replace("_", "-"): v for k, v in over.items()})
    return hyphenate(data)


def hyphenate(data: dict) -> dict:
    """One spelling per key (a key given twice in one file would be ambiguous)."""
    out = {}
    for k, v in data.items():
        out[k.replace("_", "-")] = v
    return out
