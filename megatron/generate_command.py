"""Text generation from a checkpoint (ours or NeoX/KERPLE), any positional scheme, kv-cache on.

    python generate.py --checkpoint runs/quickstart/checkpoints --prompt "def main(" --greedy
    python generate.py --checkpoint CKPT --prompt-file prompts.txt --temperature 0.8 --top-k 50 --top-p 0.95
    python generate.py --checkpoint CKPT --interactive

The prompt is fed once; then one token per step through the kv cache (megatron/model/kv_cache.py),
so each step costs O(context) instead of re-running the whole sequence. The text is written as the
tokens come; a request whose kv-cache cannot fit in memory is refused first, saying what fits
(megatron/generation.py, which holds the decoding loop). Prints tokens/s.
"""
from __future__ import annotations

import argparse
import sys
import time

from megatron.checkpoint.tags import resolve_tag, tag_or_latest
from megatron.checkpoint.trust import add_load_flags, apply_trust_flag
from megatron.cli_args import ArgumentParser, int_at_least
from megatron.config.overrides import parse_overrides
from megatron.device import add_device_flag, device_from_flag
from megatron.errors import UserError
from megatron.tokenizer import build_tokenizer


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="directory holding `latest` and global_step<N>/")
    p.add_argument("--iteration", type=int_at_least(0), default=None)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompt-file", help="one prompt per line (blank lines skipped)")
    src.add_argument("--interactive", action="store_true", help="read prompts from stdin until EOF")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--greedy", action="store_true", help="argmax decoding (ignores temperature/top-k/top-p)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus: smallest set with probability >= p")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--stop-at-eod", action="store_true", help="stop a sequence at the tokenizer's eod")
    add_device_flag(p)
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of the checkpoint, e.g. -o vocab-file=data/tok.json")
    add_load_flags(p)
    args = p.parse_args(argv)
    if args.temperature <= 0 or not 0 < args.top_p <= 1 or args.top_k < 0 or args.max_new_tokens < 1:
        p.error("need --temperature > 0, 0 < --top-p <= 1, --top-k >= 0, --max-new-tokens >= 1 "
                "(use --greedy for deterministic decoding)")
    return args


def prompts(args):
    """The prompts: a list (a --prompt-file is read now, so a bad path fails before the model
    loads), or a generator over stdin for --interactive."""
    if args.prompt is not None:
        if not args.prompt.strip():
            raise UserError("--prompt is empty: nothing to generate; give the text to continue, e.g. --prompt 'def main('")
        return [args.prompt]
    if args.prompt_file:
        with open(args.prompt_file) as f:
            texts = [line.rstrip("\n") for line in f if line.strip()]
        if not texts:
            raise UserError(f"--prompt-file {args.prompt_file} holds no prompt (it is empty or blank): nothing to "
                            "generate; write one prompt per line into it")
        return texts
    return interactive_prompts()


def interactive_prompts():
    print("enter a prompt (Ctrl-D to quit):", file=sys.stderr)
    for line in sys.stdin:
        if line.strip():
            yield line.rstrip("\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    apply_trust_flag(args)
    texts = prompts(args)

    resolve_tag(args.checkpoint, tag_or_latest(args.iteration))  # a missing checkpoint: answered before torch loads

    args.device = device_from_flag(args.device, "generate.py")
    # lazy: the model's modules pull in torch; a missing checkpoint is answered above without it
    from megatron.checkpoint.load_model import load_checkpoint_model
    from megatron.generation import TokenStream, check_new_tokens_fit, generate_tokens

    model, cfg, client = load_checkpoint_model(args.checkpoint, tag_or_latest(args.iteration),
                                               parse_overrides(args.override) or None, args.device, args.allow_nonfinite)
    import torch  # lazy: kept off the module's top, as above (loaded by now)

    d = cfg.data
    if client.get("tokenizer", "") is None and d.vocab_file is None:  # tools/import_hf.py found none to copy
        raise UserError(f"{args.checkpoint} has no tokenizer: it was imported from {client.get('imported_from')} "
                        "without tokenizer.json or tokenizer.model; name the model's tokenizer: generate.py "
                        f"--checkpoint {args.checkpoint} -o tokenizer-type=HFTokenizer -o vocab-file=PATH/tokenizer.json "
                        "(SPMTokenizer for a tokenizer.model) ...")
    tok = build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    limit = model.position.max_length()
    generated = skipped = 0
    for text in texts:
        ids = tok.tokenize(text)
        if not ids:
            print(f"generate.py: the prompt {text!r} tokenizes to nothing; skipped", file=sys.stderr)
            skipped += 1
            continue
        if limit and len(ids) + args.max_new_tokens > limit:
            raise UserError(f"pos-emb {cfg.model.pos_emb} represents at most {limit} positions; the prompt has "
                            f"{len(ids)} tokens + --max-new-tokens {args.max_new_tokens}: shorten either")
        check_new_tokens_fit(model, len(ids), args.max_new_tokens, args.device)  # before, not out of memory
        start = time.perf_counter()
        print(text, end="", flush=True)
        stream = TokenStream(tok)  # each token's text as it comes
        new = generate_tokens(model, ids, args.max_new_tokens, args.greedy, args.temperature, args.top_k,
                              args.top_p, gen, tok.eod if args.stop_at_eod else None, tok.vocab_size, stream.push)
        stream.finish()
        print(flush=True)
        secs = time.perf_counter() - start
        print(f"[generate] {len(new)} tokens in {secs:.2f}s ({len(new) / secs:.1f} tokens/s, prompt "
              f"{len(ids)} tokens, kv-cache on)", file=sys.stderr, flush=True)
        generated += 1
    if skipped and not generated:  # every prompt skipped: say so, and not with exit 0
        raise UserError(f"none of the {skipped} prompts tokenizes to any token of {d.tokenizer_type}: nothing was "
                        "generated; give prompts in text the tokenizer knows")
    return 0

