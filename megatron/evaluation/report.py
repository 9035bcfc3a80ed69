"""Evaluation outputs: one JSON (machine), CSV (spreadsheets), markdown (humans)."""
from __future__ import annotations

import csv
import json
import os

import numpy as np

from megatron.atomic_io import atomic_output
from megatron.evaluation.retrieval.summary import markdown as retrieval_markdown
from megatron.evaluation.windows import windows_line

SCHEMA = "kerple-eval/1"


def default_output_dir(ckpt: str) -> str:
    """Where a checkpoint's evaluation results go unless --out says otherwise: <ckpt>/../eval
    (evaluate.py's perplexity sweep and every downstream-task entry point)."""
    return os.path.join(os.path.dirname(os.path.abspath(ckpt)), "eval")


def bin_curve(curve: np.ndarray, max_points: int = 256) -> tuple[int, list[float]]:
    """Average a per-position curve into at most max_points bins (keeps eval.json small)."""
    size = max(1, -(-len(curve) // max_points))
    n = len(curve) // size * size
    binned = curve[:n].reshape(-1, size).mean(1).tolist()
    if n < len(curve):
        binned.append(float(curve[n:].mean()))
    return size, [round(float(x), 6) for x in binned]


def build_record(meta: dict, results) -> dict:
    rec = dict(schema=SCHEMA, **meta)
    rec["results"] = [
        {"length": r.length, "loss": r.loss, "ppl": r.ppl, "windows": r.windows,
         "windows_requested": getattr(r, "requested", None), "tokens": r.tokens,
         "seconds": round(r.seconds, 3),
         # spread over ranks (meta's `ranks`): the windows each scored; one process's records keep their keys
         **({"windows_per_rank": r.windows_per_rank} if getattr(r, "windows_per_rank", None) else {})}
        for r in results
    ]
    rec["perplexity"] = {str(r.length): r.ppl for r in results}
    rec["positionwise"] = {}
    for r in results:
        size, curve = bin_curve(r.positionwise)
        rec["positionwise"][str(r.length)] = {"bin_size": size, "loss": curve}
    return rec


def windows_cell(r: dict) -> str:
    """The window count, with the count asked for when the split had fewer."""
    asked = r.get("windows_requested")
    return f"{r['windows']} of {asked}" if asked is not None and r["windows"] < asked else str(r["windows"])


def attention_label(rec: dict) -> str:
    """How attention saw each window. A windowed, blockwise or strided evaluation is not comparable
    with a full-attention one, so every table and header names it."""
    parts = []
    if rec.get("window"):
        parts.append(f"sliding-window attention W={rec['window']}")
    if rec.get("blockwise_causal"):
        parts.append(f"blockwise causal attention, blocks of {rec['blockwise_causal']}")
    parts = parts or ["full causal attention"]
    if rec.get("mode") == "strided":
        parts.append(f"strided evaluation, stride {rec['stride']} (each window scores only its last {rec['stride']} tokens)")
    return ", ".join(parts)


def markdown_table(rec: dict) -> str:
    """The per-length table; with --equal-text, its perplexity on the same text at every length beside."""
    train, equal = rec.get("train_length"), rec.get("equal_text")
    head = "| length | x train | loss | ppl | windows | tokens |" + (" ppl, equal text |" if equal else "")
    lines = [head, "|---:|---:|---:|---:|---:|---:|" + ("---:|" if equal else "")]
    for r in rec["results"]:
        ratio = f"{r['length'] / train:g}" if train else "-"
        cell = f" {equal[str(r['length'])]['ppl']:.3f} |" if equal and str(r["length"]) in equal else (
            " - |" if equal else "")
        lines.append(f"| {r['length']} | {ratio} | {r['loss']:.4f} | {r['ppl']:.3f} | {windows_cell(r)} | {r['tokens']} |"
                     + cell)
    text = "\n".join(lines) + "\n\n" + windows_line(rec.get("window_order"), rec.get("data_seed"))
    if equal:
        text += (f" `ppl` scores each length on its own windows (different text at each length); `ppl, equal text` "
                 f"scores the same {equal['spans']} spans of {equal['scored_tokens_per_span']} tokens at every length, "
                 "each read with the length's context before it, so only the context differs.")
    return text + f" Attention: {attention_label(rec)}."


RESULT_FILES = {"json": "eval.json", "csv": "eval.csv", "md": "eval.md", "positionwise": "positionwise.csv"}


def write_outputs(rec: dict, results, out_dir: str) -> dict[str, str]:
    """The perplexity sweep's RESULT_FILES, each written whole (temporary name, then rename),
    eval.json last."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, name) for k, name in RESULT_FILES.items()}
    with atomic_output(paths["csv"], fsync=False) as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["length", "loss", "ppl", "windows", "tokens", "windows_requested", "window_order", "data_seed"])
        for r in rec["results"]:
            w.writerow([r["length"], f"{r['loss']:.6f}", f"{r['ppl']:.6f}", r["windows"], r["tokens"],
                        "" if r.get("windows_requested") is None else r["windows_requested"],
                        rec.get("window_order"), rec.get("data_seed")])
    with atomic_output(paths["md"], fsync=False) as tmp, open(tmp, "w") as f:
        f.write(f"# Perplexity by length: {rec.get('pos_emb')}, {attention_label(rec)} "
                f"({rec.get('checkpoint')}, {rec.get('split')} split)\n\n")
        f.write(markdown_table(rec) + "\n")
        for task, section in rec.get("retrieval", {}).items():
            f.write("\n" + retrieval_markdown(task, section, rec.get("train_length")) + "\n")
    with atomic_output(paths["positionwise"], fsync=False) as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["length", "position", "loss", "window_order", "data_seed"])
        for r in results:
            for i, v in enumerate(r.positionwise):
                w.writerow([r.length, i, f"{v:.6f}", rec.get("window_order"), rec.get("data_seed")])
    # last: eval.json is what says "evaluated" (run_matrix, aggregate_results)
    with atomic_output(paths["json"], fsync=False) as tmp, open(tmp, "w") as f:
        json.dump(rec, f, indent=1)
    return paths
