"""The state-dict adapter, ONE name map read by both directions (torchtitan's
StateDictAdapter.from_hf / to_hf): a rule names our tensor, the stock class's tensor(s), and for a
tensor stored differently the pair of functions between the layouts. Each family's subclass, with
the rest of what the family says, is its file in megatron/interop/hf_families/.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from megatron.errors import UserError

PARTS = ("weight", "bias")


@dataclass(frozen=True)
class Rule:
    """Our tensor `ours` <-> the foreign tensors `theirs` (one, or several joined into ours)."""
    ours: str
    theirs: tuple[str, ...]
    join: Callable | None = None  # theirs' tensors -> ours (None: the one tensor as it is)
    split: Callable | None = None  # ours -> theirs' tensors, in order
    optional: bool = False  # absent on both sides in some models (biases, an untied head)


class StateDictAdapter:
    """from_hf(weights) -> our GPTModel state; to_hf(state) -> the stock class's tensors."""

    head = ""  # the output matrix's foreign name (tied models may still save it)

    def __init__(self, model_cfg):
        self.m = model_cfg

    def rules(self) -> list[Rule]:
        raise NotImplementedError

    def _all_rules(self) -> list[Rule]:
        out = self.rules()
        if self.m.no_weight_tying:
            out.append(Rule("output_layer.weight", (self.head,)))
        return out

    def from_hf(self, weights: dict) -> dict:
        out, used = {}, set()
        for r in self._all_rules():
            present = [n in weights for n in r.theirs]
            if not all(present):
                if r.optional and not any(present):
                    continue
                missing = next(n for n, p in zip(r.theirs, present) if not p)
                raise UserError(f"the weights have no tensor {missing!r}, which this architecture needs; is "
                                "config.json the one these weights were saved with?")
            used.update(r.theirs)
            tensors = [weights[n] for n in r.theirs]
            out[r.ours] = r.join(*tensors) if r.join else tensors[0]
        used.add(self.head)  # a tied model may still save the (same) matrix
        left = [k for k in weights if k not in used and not k.endswith("rotary_emb.inv_freq")]
        if left:
            raise UserError(f"the weights hold tensors this architecture does not use: {left[:6]}"
                            f"{' ...' if len(left) > 6 else ''}; is config.json the one these weights were saved with?")
        return out

    def to_hf(self, state: dict) -> dict:
        out, used = {}, set()
        for r in self._all_rules():
            if r.ours not in state:
                if r.optional:
                    continue
                raise UserError(f"the model has no tensor {r.ours!r}, which {type(self).__name__} writes")
            used.add(r.ours)
            tensors = r.split(state[r.ours]) if r.split else (state[r.ours],)
            out.update(zip(r.theirs, tensors))
        left = [k for k in state if k not in used and not k.startswith("position.")]
        if left:  # a tensor the stock class has no place for would be dropped silently
            raise UserError(f"{type(self).__name__} has no place for the model's tensors {left[:6]}; export "
                            "this model with its remote code instead")
        return {k: v.contiguous() for k, v in out.items()}
