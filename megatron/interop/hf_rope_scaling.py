"""transformers' RoPE types (config.json's rope_scaling / rope_parameters) <-> this stack's
`rotary-scaling` keys, both ways, each parameter read as transformers 5 reads it
(modeling_rope_utils.py: `_compute_*_parameters`, `standardize_rope_params`):

    rope_type   parameters transformers reads           -> this stack (megatron/positional/rope_scaling.py)
    default     -                                          rotary-scaling none
    linear      factor                                     linear, rotary-scaling-factor
    dynamic     factor; max_position_embeddings is L       dynamic, factor, rotary-scaling-original-length = L
    yarn        factor (null: max_position_embeddings /    yarn, factor, original-length, rotary-yarn-beta-fast
                original_max_position_embeddings),         / -slow; the attention factor and truncation only
                original_max_position_embeddings, beta_fast, where they equal this stack's (0.1 ln factor + 1;
                beta_slow, attention_factor, mscale,        floored / ceiled correction range)
                mscale_all_dim, truncate
    llama3      factor, original_max_position_embeddings,  llama3, factor, original-length,
                low_freq_factor, high_freq_factor          rotary-llama3-low/high-freq-factor

Every other type (longrope, transformers 4's su, proportional, ...) is refused by name, and so is a
parameter whose value would make transformers compute something this stack does not: none is
dropped. A key no transformers function reads for that type is ignored, as transformers ignores
it, and said in a note. tools/export_hf.py writes the same table backwards (`export_rope`)."""
from __future__ import annotations

import math

from megatron.config.untrusted_json import json_type
from megatron.positional.rope_scaling import RopeScaling

SCALED = ("linear", "dynamic", "yarn", "llama3")  # transformers' names, which are also ours
# what transformers reads from the dict besides the type (and rope_theta, partial_rotary_factor: hf_config.py)
READ = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
        "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale",
                 "mscale_all_dim", "truncate"),
        "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor")}
COMMON = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
NOT_IMPORTED = {
    "longrope": "LongRoPE's per-frequency factors (Phi-3), switched by the length",
    "su": "transformers 4's name of LongRoPE (Phi-3's per-frequency factors)",
}


def rope_type(r, rope: dict, rope_key: str) -> str:
    """The RoPE type of `rope` (rope_type, else transformers 4's `type`, else default), refused by
    name unless transformers' default or one of SCALED."""
    given = [k for k in ("rope_type", "type") if k in rope]
    kinds = {rope[k] for k in given if isinstance(rope[k], str)}
    if len(kinds) == 2:
        raise r.refuse(f"{rope_key}.type", f"is {rope['type']!r} but {rope_key}.rope_type is {rope['rope_type']!r}: "
                                           "keep one (the type the model was trained with)")
    kind = rope[given[0]] if given else "default"
    if kind in ("default", *SCALED):
        return kind
    what = NOT_IMPORTED.get(kind, "a RoPE this stack does not implement") if isinstance(kind, str) else json_type(kind)
    raise r.refuse(f"{rope_key}.{given[0]}", f"is {kind!r} ({what}): tools/import_hf.py imports transformers' RoPE types "
                                             f"default, {', '.join(SCALED)} (this stack's rotary-scaling), and no other")


def import_rope(r, rope: dict, rope_key: str, kind: str, rotary_dims: int, head_dim: int, max_positions: int):
    """({NeoX key: value}, {NeoX key: the config.json key it came from}, notes) for RoPE type `kind`
    of dict `rope` (`rope_key`: where it is in config.json); `r`: hf_config's reader."""
    where = f"{r.path}'s {rope_key}"
    nested = sorted(k for k, v in rope.items() if isinstance(v, dict))
    if nested:
        raise r.refuse(f"{rope_key}.{nested[0]}", "is an object: RoPE parameters per layer type; every layer of this "
                                                  "stack has the same RoPE")
    ignored = sorted(k for k in rope if k not in COMMON and k not in READ[kind])
    notes = [f"{where}: {', '.join(ignored)}: transformers' {kind} RoPE does not read "
             f"{'these keys' if len(ignored) > 1 else 'this key'}; ignored, as transformers ignores "
             f"{'them' if len(ignored) > 1 else 'it'}"] if ignored else []
    if kind == "default":
        return {}, {}, notes

    def number(name: str, required: bool = True, nullable: bool = False):
        """rope[name], a finite number; None when absent (refused if `required`: transformers' config
        class refuses it too) or null (refused unless `nullable`)."""
        if name not in rope:
            if required:
                raise r.refuse(f"{rope_key}.{name}", f"is missing: transformers' {kind} RoPE needs it (its config "
                                                     "class refuses this config.json too)")
            return None
        v = rope[name]
        if v is None and nullable:
            return None
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise r.refuse(f"{rope_key}.{name}", f"is {json_type(v)} ({str(v)[:40]}); transformers' {kind} RoPE "
                                                 "needs a number: is this config.json damaged?")
        return v

    type_key = f"{rope_key}.{'rope_type' if 'rope_type' in rope else 'type'}"
    keys, src = {"rotary-scaling": kind}, {"rotary-scaling": type_key}
    factor = number("factor", nullable=kind == "yarn")
    if kind == "dynamic":
        if rotary_dims == 2:
            raise r.refuse(type_key, "is 'dynamic' on 2 rotated channels: transformers' dynamic NTK divides by "
                                     "(channels - 2)")
        # transformers' dynamic scales from max_position_embeddings, never original_max_position_embeddings
        keys["rotary-scaling-original-length"] = max_positions
        src["rotary-scaling-original-length"] = "max_position_embeddings"
    if kind in ("yarn", "llama3"):
        original = _original_length(r, rope, rope_key, max_positions)
        keys["rotary-scaling-original-length"], src["rotary-scaling-original-length"] = original
        original = original[0]
    if kind == "yarn":
        if factor is None:  # transformers' rule for a null factor
            factor = max_positions / original
        implicit = max_positions / original
        if implicit not in (1, factor):
            raise r.refuse(f"{rope_key}.factor", f"is {factor}, but max_position_embeddings / original_max_position_"
                                                 f"embeddings = {max_positions} / {original} = {implicit:g}: transformers "
                                                 "5 scales YaRN by the factor, some transformers 4 releases by that "
                                                 "ratio, so the config is ambiguous; make them agree (the length the "
                                                 "model was extended to)")
        _yarn_temperature(r, rope, rope_key, float(factor), number)
        if rotary_dims < head_dim and RopeScaling("yarn", float(factor)).attention_factor() != 1.0:
            raise r.refuse(type_key, f"is 'yarn' on {rotary_dims} of {head_dim} channels (partial rotary): "
                                     "transformers multiplies the rotated channels only by YaRN's temperature, this "
                                     "stack's yarn the whole of q and k (the paper's); they agree only when every "
                                     "channel rotates")
        truncate = rope.get("truncate", True)
        if truncate is not True:
            raise r.refuse(f"{rope_key}.truncate", f"is {json_type(truncate)} ({truncate}): transformers then uses "
                                                   "YaRN's correction range unrounded; this stack's yarn floors and "
                                                   "ceils it (the paper's code), so only truncate: true is imported")
        for name, ours in (("beta_fast", "rotary-yarn-beta-fast"), ("beta_slow", "rotary-yarn-beta-slow")):
            value = number(name, required=False, nullable=True)
            if value:  # transformers: `get(name) or default`, so null and 0 take the default, as here
                keys[ours], src[ours] = float(value), f"{rope_key}.{name}"
    if kind == "llama3":
        for name in ("low_freq_factor", "high_freq_factor"):
            ours = f"rotary-llama3-{name.replace('_', '-')}"
            keys[ours], src[ours] = float(number(name)), f"{rope_key}.{name}"
    keys["rotary-scaling-factor"], src["rotary-scaling-factor"] = float(factor), f"{rope_key}.factor"
    return keys, src, notes


def _original_length(r, rope: dict, rope_key: str, max_positions: int) -> tuple[int, str]:
    """(original_max_position_embeddings, the key it came from) for yarn and llama3. transformers 5
    builds the model with a top-level original_max_position_embeddings over the dict's (Phi-3's
    convention), transformers 4 reads the dict's: both present must agree; neither: max_position_embeddings."""
    inner = rope.get("original_max_position_embeddings")
    top = r.hf.get("original_max_position_embeddings")
    r.read.add("original_max_position_embeddings")
    found = [(v, k) for v, k in ((inner, f"{rope_key}.original_max_position_embeddings"),
                                 (top, "original_max_position_embeddings")) if v is not None]
    for v, k in found:
        if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            raise r.refuse(k, f"is {json_type(v)} ({str(v)[:40]}); transformers needs a whole number >= 1: is this "
                              "config.json damaged?")
    if not found:
        return max_positions, "max_position_embeddings"
    used = found[-1]  # transformers 5: the top-level key wins
    if top is not None and top != (inner if inner is not None else max_positions):
        raise r.refuse("original_max_position_embeddings",
                       f"is {top}, but {rope_key}.original_max_position_embeddings is "
                       f"{inner if inner is not None else f'absent (so max_position_embeddings, {max_positions})'}: "
                       "transformers 5 uses the first, transformers 4 the second; keep one, with the length the model "
                       "was pretrained at")
    return used


def _yarn_temperature(r, rope: dict, rope_key: str, factor: float, number) -> None:
    """transformers' YaRN attention factor (attention_factor, else mscale / mscale_all_dim, else 0.1
    ln(factor) + 1) must be this stack's, which is the last; any other value is refused by the key
    that sets it."""
    ours = RopeScaling("yarn", factor).attention_factor()

    def get_mscale(scale: float, m: float = 1.0) -> float:  # transformers' helper of that name
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    given = number("attention_factor", required=False, nullable=True)
    mscale = number("mscale", required=False, nullable=True)
    all_dim = number("mscale_all_dim", required=False, nullable=True)
    if given is not None:
        theirs, key = given, "attention_factor"
    elif mscale and all_dim:
        theirs, key = get_mscale(factor, mscale) / get_mscale(factor, all_dim), "mscale"
    else:
        theirs, key = get_mscale(factor), None
    if not math.isclose(theirs, ours, rel_tol=1e-9):
        detail = (f"is {given}" if key == "attention_factor" else
                  f"is {mscale} with mscale_all_dim {all_dim}: transformers' attention factor is {theirs:.6g}")
        raise r.refuse(f"{rope_key}.{key}", f"{detail}; this stack's yarn uses 0.1 ln(factor) + 1 = {ours:.6g} (the "
                                            "paper's temperature), so this model is not imported")


def export_rope(m, max_positions: int) -> tuple[dict | None, str]:
    """(the rope_parameters entries besides rope_theta expressing model config `m`'s rotary-scaling
    in a stock transformers class, or None; why not, when None). `max_positions`: the config.json's
    max_position_embeddings."""
    kind, factor, original = m.rotary_scaling, m.rotary_scaling_factor, m.rotary_scaling_original_length
    if kind == "none":
        return {"rope_type": "default"}, ""
    if kind == "ntk":
        return None, ("rotary-scaling ntk (transformers' NTK scaling is dynamic only, its factor changing with "
                      "the length)")
    if kind == "dynamic" and original != max_positions:
        return None, (f"rotary-scaling dynamic from rotary-scaling-original-length {original}, not from "
                      f"max-position-embeddings {max_positions} as transformers' dynamic")
    if kind == "yarn" and m.rotary_pct != 1.0 and RopeScaling("yarn", factor).attention_factor() != 1.0:
        return None, ("rotary-scaling yarn with rotary-pct < 1 (transformers applies YaRN's temperature to the "
                      "rotated channels only)")
    if kind == "yarn" and max_positions / original not in (1, factor):
        return None, (f"rotary-scaling yarn by {factor} from {original} positions to max-position-embeddings "
                      f"{max_positions} (transformers 4 would scale by their ratio)")
    out = {"rope_type": kind, "factor": factor}
    if kind in ("yarn", "llama3"):
        out["original_max_position_embeddings"] = original
    if kind == "yarn":
        out.update(beta_fast=m.rotary_yarn_beta_fast, beta_slow=m.rotary_yarn_beta_slow)
    if kind == "llama3":
        out.update(low_freq_factor=m.rotary_llama3_low_freq_factor, high_freq_factor=m.rotary_llama3_high_freq_factor)
    return out, ""
