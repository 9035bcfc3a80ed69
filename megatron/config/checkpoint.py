"""Saving and loading checkpoints (DeepSpeed/NeoX layout)."""
from __future__ import annotations

from dataclasses import dataclass

from megatron.config.fields import key


@dataclass(frozen=True)
class CheckpointConfig:
    save: str | None = key(None, "Directory to save checkpoints into; not set = <run-dir>/checkpoints "
                           "when checkpoint-factor (save-interval) is set, null = never save.")
    load: str | None = key(None, "Directory to load the latest (or `iteration`) checkpoint from; not set "
                           "= save when save is derived from run-dir (re-running resumes), null = never. "
                           "A directory other than save must hold a checkpoint.")
    save_interval: int | None = key(
        None, "KERPLE 2022 name of checkpoint-factor: save every this many iterations.", ge=1)
    checkpoint_factor: int | None = key(
        None, "Save every this many iterations (linear scale) or at powers of it (log scale). "
        "Required when save is set; save-interval is the same setting.", ge=1)
    keep_last_n_checkpoints: int | None = key(None, "Delete older checkpoints; null = keep all.", ge=1)
    checkpoint_scale: str = key("linear", "Spacing of saves.", choices=("linear", "log"))
    extra_save_iters: list[int] | None = key(None, "Also save at these iterations.")
    no_save_optim: bool = key(
        False, "NeoX: do not save optimizer state. Here the optimizer state is always saved (DeepSpeed's "
        "save has no switch for it); use tools/export_hf.py for weights only.", inert=True)
    no_load_optim: bool = key(False, "Do not load optimizer state.")
    no_save_rng: bool = key(False, "Do not save RNG state.")
    no_load_rng: bool = key(False, "Do not load RNG state.")
    finetune: bool = key(False, "Load weights only and start at iteration 0.")
    finetune_new_pos_emb: bool = key(
        False, "Our key, with finetune: the checkpoint was trained with another pos-emb (a released rotary "
        "model given KERPLE, say): every other tensor is loaded and the new scheme's parameters start from "
        "their initial values; the old scheme's tensors (rotary's inv_freq) are dropped. Refused without "
        "finetune, or when pos-emb is the checkpoint's own.")
    iteration: int | None = key(None, "Load this step instead of the one `latest` names.", ge=0)
    overwrite_checkpoints: bool = key(
        False, "Let a run that does not resume from `save` start over there: the checkpoints `save` already "
        "holds (global_step*/ and `latest`) are deleted before the first step. Without it such a run is refused, "
        "naming the steps found: a fresh run (load unset, or load elsewhere) into a directory with another run's "
        "checkpoints, or one whose `latest` is missing (deleted, or not synced). A run that resumes from `save` "
        "is not affected, so the key can stay in a config that is re-run.")
    allow_seq_length_change: bool = key(
        False, "Resume a checkpoint whose run used another seq-length. Refused by default: samples are "
        "cut at seq-length, so the resumed run would read a different sample order than the saved data "
        "position assumes (some text twice, some never). With true it resumes, saying so.")
    allow_nonfinite_weights: bool = key(
        False, "Load a checkpoint even when its weights or optimizer state hold NaN/inf. By default such a "
        "checkpoint (saved by a run that had diverged) is refused, naming the file and the first offending "
        "tensors; the CLIs' --allow-nonfinite is the same switch.")
    checkpoint_validation_with_forward_pass: bool = key(
        False, "NeoX's post-save forward-pass check; accepted, changes nothing here.", inert=True)

    @property
    def interval(self) -> int | None:
        """The save interval, whichever of the two keys set it."""
        return self.checkpoint_factor if self.checkpoint_factor is not None else self.save_interval

    def check(self) -> list[tuple[str, str]]:
        out = []
        a, b = self.save_interval, self.checkpoint_factor
        if a is not None and b is not None and a != b:
            out.append(("checkpoint_factor", f"differs from save-interval ({a}); they are one "
                        "setting, set one of them"))
        if self.save is not None and self.interval is None:
            out.append(("save", "checkpoint-factor (or save-interval) is required when save is set"))
        if self.finetune_new_pos_emb and not (self.finetune and self.load):
            out.append(("finetune_new_pos_emb", "needs finetune: true and a load directory (it starts a new "
                        "positional scheme on a checkpoint's weights)"))
        return out
