"""The weight files of a Hugging Face model directory, as untrusted input: which file holds each
tensor, what it declares, and that against what config.json describes, all before a byte of data is
read (safetensors) or used (.bin, which has no header to check first).

    model.safetensors                          one file
    model.safetensors.index.json + shards      {"weight_map": {tensor: shard file}}; each shard must
                                               hold exactly the tensors the map puts there
    pytorch_model.bin[.index.json + shards]    weights-only torch files (no code is unpickled)

Every refusal names the file a tensor was (or should have been) in, and the config.json key
that disagrees with it.
"""
from __future__ import annotations

import os
import pickle
import re

import torch

from megatron.checkpoint.safe_load import not_a_torch_file
from megatron.config.untrusted_json import read_json
from megatron.errors import UserError
from megatron.interop.hf_families import families, family
from megatron.interop.safetensors_file import DTYPES, FLOATS, RESAVE, SafetensorsError, read_header, read_tensors

MAX_INDEX_BYTES = 64 << 20  # a 400B model's index names ~2,000 tensors: ~200 KiB
SAFETENSORS, BIN = "model.safetensors", "pytorch_model.bin"
FLOAT_NAMES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


def _layer_pattern() -> re.Pattern:
    """A layer's tensor name in any family (gpt_neox.layers.3., model.layers.3.): group 1 its number."""
    prefixes = sorted({re.escape(f.layers_prefix) for f in families().values()})
    return re.compile(rf"^(?:{'|'.join(prefixes)})(\d+)\.")


class WeightFiles:
    """Where each tensor of `hf_dir` is and what it is declared as (meta tensors), read lazily."""

    def __init__(self, hf_dir: str):
        names = os.listdir(hf_dir)
        self.hf_dir, self.index = hf_dir, None
        self.where: dict[str, str] = {}  # tensor -> the file holding it
        self.meta: dict[str, torch.Tensor] = {}  # tensor -> its dtype and shape, no data
        self._headers: dict[str, dict] = {}  # safetensors file -> read_header's entries
        self._loaded: dict[str, torch.Tensor] = {}  # .bin tensors (no header: read whole)
        for single in (SAFETENSORS, BIN):
            if single + ".index.json" in names or single in names:
                self._find(single)
                return
        raise UserError(f"{hf_dir}: no {SAFETENSORS}, {BIN} or their sharded index; give a directory written by "
                        "save_pretrained")

    def _find(self, single: str) -> None:
        index = os.path.join(self.hf_dir, single + ".index.json")
        if os.path.isfile(index):
            self.index = index
            by_shard: dict[str, set] = {}
            for tensor, shard in read_index(index, single).items():
                by_shard.setdefault(shard, set()).add(tensor)
            missing = [s for s in sorted(by_shard) if not os.path.isfile(os.path.join(self.hf_dir, s))]
            if missing:
                raise UserError(f"{index} names shard files that are not in {self.hf_dir}: {', '.join(missing[:4])}; "
                                "download or copy every shard")
            for shard, expected in sorted(by_shard.items()):
                self._add(os.path.join(self.hf_dir, shard), expected)
        else:
            self._add(os.path.join(self.hf_dir, single), None)

    def _add(self, path: str, expected: set | None) -> None:
        if path.endswith(".safetensors"):
            entries = read_header(path)
            self._headers[path] = entries
            held = {k: e.meta() for k, e in entries.items()}
        else:
            held = load_bin(path)
            self._loaded.update(held)
        if expected is not None and set(held) != expected:
            lacks, strays = sorted(expected - set(held)), sorted(set(held) - expected)
            parts = ([f"lacks {_few(lacks)}, which {os.path.basename(self.index)}'s weight_map puts in it"] if lacks else []) + \
                    ([f"holds {_few(strays)}, which the weight_map puts in another shard or nowhere"] if strays else [])
            raise UserError(f"{path} is not the shard {self.index} describes: it {' and '.join(parts)}; is it another "
                            "shard under this name? download or copy the shards again")
        for k, t in held.items():
            if k in self.where:  # only without an index (an index maps a tensor to one shard)
                raise UserError(f"tensor {k!r} is in both {self.where[k]} and {path}: download or copy the shards again")
            self.where[k] = path
            self.meta[k] = t if t.device.type == "meta" else torch.empty(t.shape, dtype=t.dtype, device="meta")

    def files(self) -> str:
        """The weight files, for messages: the index when there is one."""
        return self.index or next(iter(sorted(set(self.where.values()))), self.hf_dir)

    def layers(self) -> int:
        """The number of transformer layers the tensor names hold (layer indices 0..n-1)."""
        layer = _layer_pattern()
        found = [int(m.group(1)) for m in map(layer.match, self.where) if m]
        return max(found) + 1 if found else 0

    def read(self) -> dict[str, torch.Tensor]:
        """{tensor: tensor} of every file, in the dtype saved (nothing rounded)."""
        out = dict(self._loaded)
        for path, entries in self._headers.items():
            out.update(read_tensors(path, entries))
        return out


def _few(names: list[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def read_index(path: str, single: str) -> dict[str, str]:
    """The weight_map of a sharded model's index: {tensor: shard file name inside the directory}."""
    fix = "download or copy it again, with its shards"
    idx = read_json(path, "a sharded model's index", MAX_INDEX_BYTES, fix=fix)
    wm = idx.get("weight_map")
    if not isinstance(wm, dict) or not wm:
        raise UserError(f"{path}: its weight_map is not an object of tensor -> shard file names; {fix}")
    suffix = os.path.splitext(single)[1]
    for tensor, shard in wm.items():
        # a file beside the index, never a path elsewhere (`../x`): the index names files, not places
        if not isinstance(shard, str) or os.path.basename(shard) != shard or shard in (".", "..") \
                or not shard.endswith(suffix):
            raise UserError(f"{path}: weight_map[{tensor!r}] is {shard!r}, not the name of a {suffix} file in the "
                            f"model's directory; {fix}")
    return wm


def load_bin(path: str) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin's tensors, unpickled weights-only (no code runs)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if "GLOBAL" in str(e):
            raise UserError(f"{path}: not a weights-only torch file (it names code: {str(e).split('GLOBAL')[1].split()[0]}); "
                            "this importer does not unpickle code: re-save it with "
                            "save_pretrained(safe_serialization=True)") from None
        raise UserError(f"{path}: not a readable torch file ({str(e).splitlines()[0][:120]}): {RESAVE}") from None
    except Exception as e:  # noqa: BLE001 - torch.load raises RuntimeError, EOFError, ValueError, ... on damage
        why = not_a_torch_file(path) or (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise UserError(f"{path}: not a readable torch file ({why}): {RESAVE}") from None
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        raise UserError(f"{path}: not a dict of named tensors (a state dict) as save_pretrained writes: {RESAVE}")
    return obj


def check_against(weights: WeightFiles, expected: dict[str, torch.Tensor], arch: str, tied: bool,
                  config_path: str, config_dtype) -> list[str]:
    """Refuse weights that are not the tensors `expected` (HF name -> meta tensor, from config.json)
    describes: missing, extra, another shape, not floating point; every problem in one message,
    naming the file each tensor is (or should be) in. Returns notes (a dtype config.json does not say)."""
    ignored = family(arch).ignored
    extra = [k for k in weights.meta if k not in expected and not ignored.fullmatch(k)
             and not (tied and k == family(arch).head)]
    missing = [k for k in expected if k not in weights.meta]
    def file(k: str) -> str:  # the directory is named once, by config_path
        return os.path.basename(weights.where[k])

    wrong_shape = [f"{k} in {file(k)} has shape {tuple(weights.meta[k].shape)}, config.json describes "
                   f"{tuple(t.shape)}" for k, t in expected.items()
                   if k in weights.meta and weights.meta[k].shape != t.shape]
    names = {v: k for k, v in FLOAT_NAMES.items()}
    not_float = [f"{k} in {file(k)} is {_st(weights.meta[k].dtype)}" for k in expected
                 if k in weights.meta and _st(weights.meta[k].dtype) not in FLOATS]
    problems = []
    if not_float:
        problems.append(f"tensors declared as integers or 8-bit floats, not the floating point a {arch}'s weights "
                        f"are saved in (config.json's dtype: {config_dtype}): {'; '.join(not_float[:4])} (a damaged "
                        "header, or quantized weights: import the unquantized release)")
    problems += wrong_shape[:3] + ([f"and {len(wrong_shape) - 3} more of another shape"] if len(wrong_shape) > 3 else [])
    if missing:
        where = (f"in no shard ({os.path.basename(weights.index)}'s weight_map does not list "
                 f"{'it' if len(missing) == 1 else 'them'})" if weights.index else f"not in {os.path.basename(weights.files())}")
        problems.append(f"{_few(missing, 6)} {'is' if len(missing) == 1 else 'are'} {where}")
    if extra:
        problems.append(f"the weight files hold tensors a {arch} as config.json describes it does not use: "
                        f"{_few(extra, 6)} (in {file(extra[0])})")
    if problems:
        raise UserError(f"the weights do not fit {config_path}: " + "; ".join(problems)
                        + "; is config.json the one these weights were saved with?")
    saved = sorted({_st(weights.meta[k].dtype) for k in expected})
    said = FLOAT_NAMES.get(config_dtype) if isinstance(config_dtype, str) else None
    if said and saved != [said]:
        return [f"{config_path}'s dtype is {config_dtype}, the weights are saved as {', '.join(saved)}: imported as "
                f"saved (nothing rounded; transformers would cast them to {names[said]})"]
    return []


def _st(dtype: torch.dtype) -> str:
    return next((k for k, v in DTYPES.items() if v == dtype), str(dtype).replace("torch.", ""))


def check_config_dtype(hf: dict, config_path: str):
    """config.json's dtype (transformers 5) or torch_dtype (4): null or a floating-point type name."""
    for key in ("dtype", "torch_dtype"):
        value = hf.get(key)
        if value is not None and not (isinstance(value, str) and value in FLOAT_NAMES):
            raise UserError(f"{config_path}'s {key} is {value!r}, not one of {', '.join(FLOAT_NAMES)}: the model's "
                            "weights are floating point (a quantized model is not imported)")
    return hf.get("dtype") or hf.get("torch_dtype")


__all__ = ["WeightFiles", "check_against", "check_config_dtype", "load_bin", "read_index", "SafetensorsError"]
