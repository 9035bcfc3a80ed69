"""Compare a fresh run's perplexities with the figures the docs show (docs/readme_figures.json: the
README's quickstart table, docs/interop.md's imported and extended models).

    python tools/check_figures.py quickstart              # after make quickstart (it runs this itself)
    python tools/check_figures.py                         # every figure set whose eval.json exists

Floating point differs by CPU, and 400 training steps carry the difference into the weights, so
the docs give each figure with the machine it came from. On a machine like one of those (CPU
vendor, thread count, torch's CPU capability) a run repeats them to every digit recorded; on
another, within the figure set's stated tolerance (twice the largest difference measured between
the machines). Prints one table per figure set; exits 1 when a value is outside its tolerance.
"""
from __future__ import annotations

import json
import os
from decimal import Decimal

from megatron.cli_args import ArgumentParser
from megatron.errors import UserError
from megatron.evaluation.results import parse_result

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FIGURES = os.path.join(ROOT, "docs", "readme_figures.json")


def load_figures(path: str = FIGURES) -> dict:
    """The figures file, each perplexity a Decimal (so its recorded digits are known), checked key by
    key: a hand edit that breaks it is named with the file and the key, not met as a traceback."""
    try:
        with open(path, encoding="utf-8") as f:
            figures = json.load(f, parse_float=Decimal)
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable JSON file ({e})") from None
    problem = figures_problem(figures)
    if problem:
        raise UserError(f"{path}: {problem}; fix the file (docs/readme_figures.json's own `about` says its form)")
    return figures


def figures_problem(figures) -> str | None:
    """The first key of the figures file that is not as check_figures reads it, or None."""
    if not isinstance(figures, dict) or not isinstance(figures.get("machines"), dict) \
            or not isinstance(figures.get("figures"), dict):
        return "the top level needs `machines` and `figures` objects"
    for key, machine in figures["machines"].items():
        if not isinstance(machine, dict) or not all(k in machine for k in ("cpu", "vendor", "threads")):
            return f"machines.{key} needs `cpu`, `vendor` and `threads`"
    for name, spec in figures["figures"].items():
        if not isinstance(spec, dict) or not isinstance(spec.get("eval"), str) or not isinstance(spec.get("ppl"), dict):
            return f"figures.{name} needs `eval` (a path) and `ppl` ({{machine: {{length: perplexity}}}})"
        for machine, values in spec["ppl"].items():
            if machine not in figures["machines"]:
                return f"figures.{name}.ppl.{machine} names no machine of `machines`"
            if not isinstance(values, dict) or not all(k.isdigit() and isinstance(v, Decimal) for k, v in values.items()):
                return f"figures.{name}.ppl.{machine} must map lengths to perplexities with decimals, e.g. {{\"128\": 122.50}}"
    return None


def this_machine() -> dict:
    """What decides whether runs repeat to the digit: CPU vendor, torch's thread count and its CPU
    capability (the kernels it dispatches)."""
    import torch  # lazy: torch only to name this machine; --help and file refusals need none

    vendor = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            vendor = next((line.split(":", 1)[1].strip() for line in f if line.startswith("vendor_id")), None)
    except OSError:
        pass
    return {"vendor": vendor, "threads": torch.get_num_threads(), "capability": torch.backends.cpu.get_cpu_capability()}


def same_machine(recorded: dict, here: dict) -> bool:
    return all(recorded.get(k) in (None, here.get(k)) for k in ("vendor", "threads", "capability"))


def judge(name: str, spec: dict, machines: dict, here: dict, measured: dict[int, float]) -> tuple[list[str], bool]:
    """Table lines comparing `measured` {length: ppl} with each machine's figures, and whether every
    value is within its tolerance: half a unit of the last recorded digit on the same machine, the
    set's `other_machine_rel` on another."""
    ok, compared = True, 0
    lines = [f"{name}: {spec['what']}", "| machine | length | stated | this run | difference | tolerance | |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for key, values in spec["ppl"].items():
        same = same_machine(machines[key], here)
        rel = spec.get("other_machine_rel")
        for length, figure in values.items():
            got = measured.get(int(length))
            if got is None:
                continue
            diff = got - float(figure)
            if same:  # half a unit of the last digit recorded
                half = Decimal(1).scaleb(figure.as_tuple().exponent) / 2
                tol, within = f"±{half}", abs(diff) <= float(half) + 1e-9
            elif rel is None:
                tol, within = "none stated", True
            else:
                tol, within = f"±{float(rel):.1%}", abs(diff) <= float(rel) * float(figure)
            ok &= within
            compared += 1
            lines.append(f"| {machines[key]['cpu']}{' (this kind)' if same else ''} | {length} | {figure} | "
                         f"{got:.3f} | {round(diff / float(figure), 4) + 0.0:+.2%} | {tol} | {'ok' if within else 'OUTSIDE'} |")
    if not compared:  # "every value within its tolerance" after comparing none would be a false all-clear
        stated = sorted({int(x) for values in spec["ppl"].values() for x in values})
        lines.append(f"COMPARED NOTHING: the run's eval.json has lengths {sorted(measured)}, the figures are at "
                     f"{stated}: evaluate those lengths ({spec['what']})")
        ok = False
    return lines, ok


def measured_ppl(path: str) -> dict[int, float]:
    try:
        return parse_result(path).ppl
    except ValueError as e:
        raise UserError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    figures = load_figures()
    p = ArgumentParser(prog="check_figures.py", description=__doc__)
    p.add_argument("sets", nargs="*", help=f"figure sets to check (default: every one whose eval.json exists): "
                                           f"{', '.join(figures['figures'])}")
    args = p.parse_args(argv)
    unknown = [s for s in args.sets if s not in figures["figures"]]
    if unknown:
        raise UserError(f"no figure set {unknown[0]!r} in {FIGURES}; the sets are {', '.join(figures['figures'])}")
    here = this_machine()
    print(f"this machine: {here['vendor']}, {here['threads']} threads, CPU capability {here['capability']}")
    all_ok, checked = True, 0
    for name in args.sets or list(figures["figures"]):
        spec = figures["figures"][name]
        path = os.path.join(ROOT, spec["eval"])
        if not os.path.isfile(path):
            if args.sets:
                raise UserError(f"{spec['eval']} does not exist: run what makes it first ({spec['what']})")
            continue
        lines, ok = judge(name, spec, figures["machines"], here, measured_ppl(path))
        print("\n".join(lines) + "\n")
        all_ok &= ok
        checked += 1
    if not checked:  # nothing compared is not "every value within its tolerance"
        print("no results to check yet: run `make quickstart` first")
        return 0
    print("every value within its tolerance" if all_ok else "some values are OUTSIDE their tolerance (above)")
    return 0 if all_ok else 1
