"""Pack what a lent GPU machine lacks to run this stack's tests and benchmarks, into `.device/`.

The device image (Python 3.12, torch, Triton, transformers, pytest-xdist; see the device tool's
KINDS.md) has no DeepSpeed, megatron-core or lm-eval, and nothing can be fetched there. This
tool, run here before the device call, writes:

  .device/pure.tar.xz    the installed files of the pure-Python distributions below, taken from
                         this checkout's .venv (DeepSpeed is published as source only; its JIT op
                         sources travel with it)
  .device/wheels/*.whl   cp312 manylinux wheels of the compiled ones, same versions as .venv
  .device/activate.sh    `source` it there: unpacks both into /tmp/site and sets PYTHONPATH
  .device/data.tar.xz    with --data: datasets the device call reads (a .bin of 37 MB is ~7 MB
                         here), unpacked by activate.sh at the same paths under the repository

Then one device call (carry [".device"]) runs, for example:

  source .device/activate.sh && python3 -m pytest -q -m gpu tests 2>&1 | tee $OUT/test-gpu.log

`.device/` is ignored by git; the bundle is ~10 MB (plus the data), under the device tool's 64 MiB
together with the working tree.

  python tools/device_bundle.py --data data/repro_v2/code/code_text_document data/repro_v2/code/tokenizer.json
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
import tarfile

from megatron.cli_args import ArgumentParser
from megatron.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, ".device")

# Distributions our code and tests import that the device image lacks (KINDS.md's package list,
# 2026-11-17), with no compiled code: their installed files work on any Python 3.
PURE = ["deepspeed", "hjson", "pydantic", "annotated-types", "typing-inspection", "lm-eval", "datasets",
        "evaluate", "dill", "multiprocess", "sqlitedict", "word2number", "more-itertools", "pytablewriter",
        "dataproperty", "mbstrdecoder", "pathvalidate", "tabledata", "tcolorpy", "typepy", "chardet",
        "rouge-score", "nltk", "jsonlines", "lm-dataformat", "pytz", "platformdirs"]
# ... and the compiled ones: wheels for the device's Python.
COMPILED = ["megatron-core", "pydantic-core", "zstandard", "ujson"]
DEVICE_PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64"]

ACTIVATE = """# source this on the device machine, in the repository root (tools/device_bundle.py wrote it)
mkdir -p /tmp/site
tar -xJf .device/pure.tar.xz -C /tmp/site || return 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
    .device/wheels/*.whl || return 1
if [ -f .device/data.tar.xz ]; then tar -xJf .device/data.tar.xz || return 1; fi
export PYTHONPATH=/tmp/site:$PWD
export TORCH_EXTENSIONS_DIR=/tmp/torch_extensions WANDB_MODE=disabled HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -c "import torch, deepspeed, megatron.core, lm_eval; print('device bundle ready: torch', torch.__version__, \\
'deepspeed', deepspeed.__version__, 'gpu', torch.cuda.get_device_name(0))"
"""


def installed_files(dist_name: str) -> list[str]:
    """Paths (relative to site-packages) of one installed distribution, bytecode left out."""
    dist = md.distribution(dist_name)
    return sorted({str(f) for f in dist.files or [] if "__pycache__" not in str(f) and not str(f).startswith("..")
                   and not str(f).endswith(".pyc")})


def pack_pure(site: str, out: str) -> int:
    count = 0
    with tarfile.open(out, "w:xz") as tar:
        for name in PURE:
            for rel in installed_files(name):
                path = os.path.join(site, rel)
                if os.path.isfile(path):
                    tar.add(path, arcname=rel)
                    count += 1
    return count


def pack_data(paths: list[str], out: str, root: str = ROOT) -> list[str]:
    """Pack datasets for the device: a path is a dataset prefix (its .bin, .idx and, where present,
    .identity.json: the fingerprint every reader checks) or a file (e.g. its tokenizer.json), taken
    relative to the repository root so that they unpack where the configs name them. Returns the
    packed names; a path that is neither is one error naming it, before anything is written."""
    names = []
    for path in paths:
        full = os.path.abspath(os.path.join(root, path))
        rel = os.path.relpath(full, root)
        if rel.startswith(".."):
            raise UserError(f"--data {path}: outside the repository; the device call sees only the checkout")
        if os.path.isfile(full):
            names.append(rel)
        elif os.path.isfile(full + ".bin") and os.path.isfile(full + ".idx"):
            names += [rel + ext for ext in (".bin", ".idx", ".identity.json") if os.path.isfile(full + ext)]
        else:
            raise UserError(f"--data {path}: neither a file nor a dataset prefix with .bin and .idx; build it first "
                            "(tools/prepare_data.py) and give the prefix, e.g. data/code/code_text_document")
    with tarfile.open(out, "w:xz") as tar:
        for rel in names:
            tar.add(os.path.join(root, rel), arcname=rel)
    return names


def download_wheels(dest: str) -> None:
    os.makedirs(dest, exist_ok=True)
    specs = [f"{name}=={md.version(name)}" for name in COMPILED]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", DEVICE_PYTHON, "--implementation", "cp", "-d", dest, *specs]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd, check=True)


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", default=[], metavar="PATH",
                   help="dataset prefixes (.bin/.idx/.identity.json) or files to take along, relative to the repository")
    args = p.parse_args()
    missing = [n for n in PURE + COMPILED if not _installed(n)]
    if missing:
        p.error(f"not installed in this environment: {', '.join(missing)}; run `make setup` and use .venv/bin/python")

    site = sysconfig.get_paths()["purelib"]
    os.makedirs(OUT, exist_ok=True)
    data = os.path.join(OUT, "data.tar.xz")
    if args.data:
        packed = pack_data(args.data, data)
        print(f"packed {len(packed)} data files: {', '.join(packed)}")
    elif os.path.exists(data):
        os.remove(data)  # an earlier bundle's data would otherwise travel and unpack again
    n = pack_pure(site, os.path.join(OUT, "pure.tar.xz"))
    download_wheels(os.path.join(OUT, "wheels"))
    with open(os.path.join(OUT, "activate.sh"), "w") as f:
        f.write(ACTIVATE)
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, xs in os.walk(OUT) for x in xs)
    print(f"wrote {OUT}: {n} files of {len(PURE)} pure-Python distributions, wheels of {', '.join(COMPILED)}; "
          f"{size / 2**20:.1f} MiB in all")
    return 0


def _installed(name: str) -> bool:
    try:
        md.distribution(name)
        return True
    except md.PackageNotFoundError:
        return False
