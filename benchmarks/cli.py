"""Argument checks shared by the benchmark tools: a bad name fails fast (argparse's exit code 2)
with the valid choices listed, instead of one error cell per length after minutes of work."""
from __future__ import annotations

import argparse

import torch
import yaml

from megatron.config.untrusted_yaml import YamlLimitError, safe_load
from megatron.device import DeviceError, resolve_device


def check_names(parser: argparse.ArgumentParser, values: list[str], valid: list[str], what: str) -> None:
    unknown = [v for v in values if v not in valid]
    if unknown:
        parser.error(f"unknown {what} {', '.join(map(repr, unknown))}; choose from: {', '.join(valid)}")


def check_positive(parser: argparse.ArgumentParser, **values) -> None:
    for name, v in values.items():
        items = v if isinstance(v, list) else [v]
        bad = [x for x in items if x is not None and x < 1]
        if bad:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {bad[0]}")


def pick_device(parser: argparse.ArgumentParser, name: str) -> torch.device:
    """--device as every entry point reads it (megatron/device.py); a bad one is argparse's error."""
    try:
        return resolve_device(name)
    except DeviceError as e:
        parser.error(str(e))


def parse_overrides(parser: argparse.ArgumentParser, items: list[str]) -> dict:
    """KEY=VALUE pairs (YAML values, as deepy.py -o) -> {key: value}."""
    out = {}
    for item in items:
        if "=" not in item:
            parser.error(f"override {item!r} must look like KEY=VALUE (e.g. num-layers=2)")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = safe_load(v, f"override {k.strip()}")
        except YamlLimitError as e:
            parser.error(str(e))
        except yaml.YAMLError as e:
            parser.error(f"override {item!r}: the value is not valid YAML ({getattr(e, 'problem', None) or e})")
    return out


def set_threads(parser: argparse.ArgumentParser, threads: int | None) -> None:
    """torch CPU threads. On a shared machine, more threads than free cores make every OpenMP
    barrier wait for a descheduled thread: a 2-core box with a neighbour job measured ~30x slower
    steps with 2 threads than with 1, so the --quick modes default to 1."""
    if threads is None:
        return
    if threads < 1:
        parser.error(f"--threads must be >= 1, got {threads}")
    torch.set_num_threads(threads)
