"""Export a checkpoint (ours, or a NeoX/KERPLE one) as a Hugging Face model directory. A model a
stock transformers class expresses (rotary on GPTNeoX's or Llama's block, Mistral's with a sliding
window: megatron/interop/hf_stock.py) is written as that class, which
AutoModelForCausalLM.from_pretrained(out) loads with no remote code; any other (KERPLE, ALiBi, T5,
...) as the remote-code model that AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
loads (the tokenizer too: AutoTokenizer.from_pretrained(out, trust_remote_code=True)).

    python tools/export_hf.py --checkpoint runs/quickstart/checkpoints --out hf/quickstart
    python tools/export_hf.py --checkpoint CKPT --out OUT --dtype bf16 --iteration 400

The directory is written whole (a temporary directory renamed into place); an existing --out is
refused unless --overwrite, which replaces all of it (no file of the earlier export is kept).
"""
from __future__ import annotations

import argparse

from megatron.atomic_io import refuse_existing_output
from megatron.checkpoint.tags import resolve_tag, tag_or_latest
from megatron.checkpoint.trust import add_load_flags, apply_trust_flag
from megatron.cli_args import ArgumentParser, int_at_least
from megatron.config.overrides import parse_overrides
from megatron.config.precision import DTYPE_NAMES
from megatron.device import add_device_flag, device_from_flag
from megatron.outputs_vs_inputs import refuse_overlap


def main(argv=None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="directory holding `latest` and global_step<N>/")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--iteration", type=int_at_least(0), default=None)
    p.add_argument("--dtype", choices=DTYPE_NAMES, default="fp32")
    p.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer files")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out directory (all of it; without this flag it is refused)")
    add_device_flag(p, " (the checkpoint is loaded there; the files written are the same)")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the checkpoint, e.g. -o vocab-file=data/tok.json")
    add_load_flags(p)
    args = p.parse_args(argv)
    apply_trust_flag(args)
    resolve_tag(args.checkpoint, tag_or_latest(args.iteration))  # a missing checkpoint: answered before torch loads
    # --out is replaced whole: never the checkpoint it reads, inside it or above it (--overwrite would delete it)
    refuse_overlap("--out", args.out, [("the checkpoint being read (--checkpoint)", args.checkpoint)], replaced_whole=True)
    refuse_existing_output(args.out, args.overwrite, "--out")  # and an earlier export
    # lazy: pulls in torch: a missing checkpoint or a taken --out is refused above without it
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.interop.hf_export import export_hf

    device = device_from_flag(args.device, "export_hf.py")
    model, cfg, _ = load_checkpoint_model(args.checkpoint, tag_or_latest(args.iteration), parse_overrides(args.override) or None,
                                          device, allow_nonfinite=args.allow_nonfinite)
    d = cfg.data  # the tokenizer files it copies are inputs too (--out data/ --overwrite would delete them)
    refuse_overlap("--out", args.out, [("the tokenizer file being exported (vocab-file)", d.vocab_file),
                                       ("the tokenizer file being exported (merge-file)", d.merge_file)], replaced_whole=True)
    info = export_hf(model, cfg, args.out, args.dtype, tokenizer=not args.no_tokenizer, overwrite=args.overwrite)
    print(f"wrote {info['out']}: {info['class']}, {info['tensors']} tensors, pos-emb {info['pos_emb']}, "
          f"tokenizer {info['tokenizer'] or 'none (no HF equivalent of the training tokenizer)'}")
    return 0
