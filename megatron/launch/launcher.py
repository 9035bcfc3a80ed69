"""What `deepy.py` does: parse the CLI, resolve the config once, then dry-run or launch.

    python deepy.py [--dry-run] [--debug] [-d DIR] [-o KEY=VALUE ...] train.py a.yml b.yml ...
    python deepy.py eval.py a.yml b.yml --eval_tasks TASK ...   # downstream tasks on `load`
    python deepy.py evaluate.py a.yml [hostfile.yml] --lengths 64,128 ...   # the perplexity sweep on `load`

The resolved config is written to `<run_dir>/resolved_config.yml` and the original files to
`<run_dir>/configs/` (they go into every checkpoint, see megatron/config/originals.py); the
training script receives only the resolved path (`--resolved-config`), so every process reads the
same validated settings. Nothing is written when the config or an input path is wrong.
`--debug` (taken off the command line by megatron.errors.run_cli, which sets KERPLE_DEBUG=1) is
passed on to the training processes, so their expected failures show the full traceback too.

Imports inside functions are the ones that pull in torch or DeepSpeed (the model for the size
check, the trainer's and the disk checks, DeepSpeed's runner): `deepy.py --help` and a config error
answer without them (tests/integration/test_cli_fast_answers.py, tests/unit/test_lazy_imports.py).
"""
from __future__ import annotations

import argparse
import os
import runpy
import subprocess
import sys

from megatron.checkpoint.trust import add_trust_flag, apply_trust_flag, trusted_from_env
from megatron.cli_args import ArgumentParser
from megatron.config import NeoXConfig, load_config
from megatron.config.inputs import input_problems, inputs_error
from megatron.config.originals import (
    RESOLVED_NAME,
    discard_staged,
    discard_stale_staging,
    staged_resolved_path,
    write_originals,
)
from megatron.config.overrides import parse_overrides
from megatron.config.paths import outside_run_dir, saves_nothing, unused_data_path
from megatron.config.sources import did_you_mean_file
from megatron.console import drop_log_message
from megatron.device import resolve_device, worker_environment
from megatron.errors import DEBUG_FLAG, UserError, debug_enabled
from megatron.evaluation.harness.cli import add_eval_flags, eval_argv
from megatron.launch.hosts import (
    MISSING_HOSTFILE,
    active_hosts,
    active_slots,
    check_hosts,
    check_slots,
    hostfile_in_use,
    missing_hostfile_warning,
    ssh_keepalive,
    unresolved,
)
from megatron.launch.shm_buffers import remove_launch_buffers
from megatron.launch.signals import StopReport, Supervisor, launcher_in_own_group
from megatron.launchers import launcher
from megatron.process.heartbeat import EXIT_LOST_HOST
from megatron.process.op_cache import set_op_cache_dir
from megatron.process.run_lock import training_locks
from megatron.tokenizer import build_tokenizer, padded_vocab_size
from megatron.training.finished import finished_iteration, finished_note, recorded_changes

# Tokenizer vocab sizes for a dry run when the vocab files are not on this machine.
KNOWN_VOCAB = {"GPT2BPETokenizer": 50257, "CharLevelTokenizer": 512, "HFGPT2Tokenizer": 50257}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="deepy.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("user_script", help="the training (or evaluation) script, e.g. train.py")
    p.add_argument("conf_file", nargs="+", help="YAML config files, merged in order (later wins)")
    p.add_argument("-d", "--conf_dir", default=None, help="directory prefixed to each config file")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set one config key after the files (YAML value), e.g. -o pos-emb=rotary")
    p.add_argument("--dry-run", action="store_true",
                   help="validate, check the input files, print the settings and parameter count and exit")

    add_trust_flag(p)  # passed on to the training processes (see runner_args)
    add_eval_flags(p)  # for eval.py, passed on to it (see eval_launch)
    args = p.parse_args(argv)
    args.parser = p
    return args


EVAL_SCRIPT = "eval.py"


def is_eval(user_script: str) -> bool:
    return os.path.basename(user_script) == EVAL_SCRIPT


def eval_launch(args, cfg) -> int:
    """eval.py: one process, here (the harness's requests are not split over ranks, so a config
    that asks for several processes is refused rather than run on one)."""

    asked = processes_asked(cfg)
    if asked:
        raise UserError(f"eval.py runs the lm-evaluation-harness in one process, but the config asks for several "
                        f"({asked}), which it would ignore: drop them (no hostfile, num-gpus: 1, num-nodes: 1) to run "
                        f"the tasks here; the perplexity sweep is spread over them: python deepy.py {EVALUATE_SCRIPT} "
                        "CONFIG.yml [hostfile.yml]")
    resolved = write_eval_config(cfg)
    sys.argv = [args.user_script, "--resolved-config", resolved, *eval_argv(args, args.parser)]
    runpy.run_path(args.user_script, run_name="__main__")
    return 0


def write_eval_config(cfg) -> str:
    """An evaluation's resolved config (and the original files) in <run_dir>/eval/, so the training
    run's own resolved_config.yml and configs/ are left as they are; returns its path."""

    eval_dir = os.path.join(cfg.logging.run_dir, "eval")
    os.makedirs(eval_dir, exist_ok=True)
    resolved = os.path.join(eval_dir, RESOLVED_NAME)
    write_originals(cfg.config_files, eval_dir)
    cfg.save(resolved)
    return resolved


def processes_asked(cfg) -> str:
    """What in the config explicitly asks for more than one process ('' if nothing): a hostfile in
    use, num-nodes or num-gpus above 1 (every visible GPU, the default, is not an explicit ask)."""

    p = cfg.parallel
    asked = [f"hostfile {p.hostfile}"] if hostfile_in_use(p.hostfile) else []
    asked += [f"{key} {value}" for key, value in (("num-nodes", p.num_nodes), ("num-gpus", p.num_gpus))
              if (value or 1) > 1]
    return ", ".join(asked)


EVALUATE_SCRIPT = "evaluate.py"


def evaluate_launch(argv: list[str]) -> int:
    """`deepy.py evaluate.py CONFIG.yml [more.yml ...] [evaluate.py's flags] [-- evaluate.py's flags]`:
    the perplexity sweep on the config's checkpoint (`load`, else `save`), spread over the processes
    the config asks for, launched as train.py's are (DeepSpeed's runner; one process runs here).
    deepy.py's own -d and -o (config overrides) come before `--`; evaluate.py's flags follow the
    config files, and those after `--` go to it verbatim (its own -o: the checkpoint's config).
    evaluate.py's own checks run here first, so a refused command writes nothing; the resolved
    config then goes to <run_dir>/eval/ (the run's own resolved_config.yml is left as it is)."""

    cut = argv.index("--") if "--" in argv else len(argv)
    p = ArgumentParser(prog=f"deepy.py {EVALUATE_SCRIPT}", allow_abbrev=False,  # --out is not --override
                       description=evaluate_launch.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("user_script")
    p.add_argument("conf_file", nargs="+", help="YAML config files, merged in order (later wins)")
    p.add_argument("-d", "--conf_dir", default=None, help="directory prefixed to each config file")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE",
                   help="set one config key after the files, e.g. -o load=runs/x/checkpoints")
    args, script_argv = p.parse_known_args(argv[:cut])
    script_argv += argv[cut + 1:]
    given = [a.split("=", 1)[0] for a in script_argv if a.split("=", 1)[0] in ("--checkpoint", "--resolved-config")]
    if given:
        raise UserError(f"{given[0]}: deepy.py {EVALUATE_SCRIPT} evaluates the checkpoint the config names (its load, "
                        f"else save): set -o load=DIR, or run python {EVALUATE_SCRIPT} --checkpoint DIR")
    cfg = load_config(config_paths(args), overrides=parse_overrides(args.override))
    check_model_size(cfg)
    missing = input_problems(cfg)
    if missing:
        raise inputs_error(missing)
    launched = needs_launcher(cfg)
    # lazy: the sweep's parser and checks pull in torch; deepy.py's --help and config refusals need none
    from megatron.evaluation.sweep import check_command, parse_args

    check_command(parse_args(script_argv, cfg=cfg), several=launched)  # its checks, before anything is written
    if launched:
        check_launch_hosts(cfg)
    resolved = write_eval_config(cfg)
    if launched:
        return launch_with_deepspeed(cfg, args.user_script, resolved, script_argv)
    sys.argv = [args.user_script, "--resolved-config", resolved, *script_argv]
    runpy.run_path(args.user_script, run_name="__main__")
    return 0


def script_named(argv: list[str]) -> str | None:
    """The script a deepy.py command line names (its first positional), without parsing the rest."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("-d", "--conf_dir")
    pre.add_argument("-o", "--override", action="append")
    pre.add_argument("script", nargs="?")
    return pre.parse_known_args(argv)[0].script


def config_paths(args) -> list[str]:
    paths = []
    for f in args.conf_file:
        if not f.endswith((".yml", ".yaml")):
            f += ".yml"  # NeoX appends the suffix
        paths.append(os.path.join(args.conf_dir, f) if args.conf_dir else f)
    return paths


def dry_vocab(cfg) -> tuple[int | None, str]:
    """(padded vocab size or None, where it came from) without failing on a missing file."""

    m, d = cfg.model, cfg.data
    if m.padded_vocab_size is not None:
        return m.padded_vocab_size, "padded-vocab-size"
    try:
        raw = build_tokenizer(d.tokenizer_type, d.vocab_file, d.merge_file).vocab_size
        where = f"tokenizer {d.tokenizer_type}"
    except (ValueError, OSError):
        if d.tokenizer_type not in KNOWN_VOCAB:
            return None, f"unknown: the {d.tokenizer_type} files cannot be read"
        raw, where = KNOWN_VOCAB[d.tokenizer_type], f"{d.tokenizer_type} default (vocab file not read)"
    return padded_vocab_size(raw, m.make_vocab_size_divisible_by, cfg.parallel.model_parallel_size), where


def dry_run(cfg) -> None:
    """Print the settings, the vocabulary and the parameter count."""

    vocab, where = dry_vocab(cfg)
    print(cfg.describe())
    print(f"vocab: {vocab} (from {where})" if vocab is not None else f"vocab: {where}")
    from megatron.model import GPTModel  # lazy: builds on torch's meta device (--help needs no torch)

    parameter_count = GPTModel.parameter_count
    if vocab is None:  # the rest is still exact: say what the embeddings add per vocabulary entry
        per_entry = parameter_count(cfg.model, 1) - parameter_count(cfg.model, 0)
        print(f"parameters: {parameter_count(cfg.model, 0):,} + {per_entry:,} per vocabulary entry (the "
              "vocabulary is unknown: set padded-vocab-size for the full count)")
    else:
        print(f"parameters: {parameter_count(cfg.model, vocab):,}")


def check_model_size(cfg) -> None:
    """A model no machine can hold, refused before anything runs and naming the file that set the
    key (GPTModel refuses it again wherever a model is built). The vocabulary counts only when
    padded-vocab-size is set: the tokenizer is read later."""
    from megatron.model import GPTModel  # lazy: builds on torch's meta device (--help needs no torch)
    from megatron.model.size import size_problem

    problem = size_problem(GPTModel.parameter_terms(cfg.model, cfg.model.padded_vocab_size or 0))
    if problem:
        raise cfg.refusal([problem])


def training_backend(cfg) -> str | None:
    """The attention backend training will resolve on this machine (the same resolve_backend call,
    scheme, device, dtype and dropout as the trainer's model), as a dry-run line; a config training
    would refuse ("cannot run pos-emb 'fire' on cpu/float32") is refused now, naming the keys.
    None for a launch to other hosts: their device is not this machine's."""
    if hostfile_in_use(cfg.parallel.hostfile) or (cfg.parallel.num_nodes or 1) > 1:
        return None
    import torch  # lazy: torch, as the size check above

    from megatron.attention.resolve import resolve_backend
    from megatron.positional.base import positional_spec
    from megatron.positional.registry import build_scheme

    m, d = cfg.model, cfg.data
    device = resolve_device(cfg.parallel.device, "device:")
    with torch.device("cpu"):
        scheme = build_scheme(m.pos_emb, positional_spec(m))
    try:
        backend = resolve_backend(m.attention_backend, scheme, device, cfg.precision.torch_dtype, training=True,
                                  dropout=m.attention_dropout > 0,
                                  documents=d.reset_attention_mask or d.reset_position_ids,
                                  sampled=d.pos_random_max_length is not None or d.pos_skip_target_length is not None)
    except ValueError as e:
        raise cfg.refusal([("attention_backend", f"training would refuse it on this machine: {e}")]) from None
    dtype = str(cfg.precision.torch_dtype).removeprefix("torch.")
    return f"attention: backend {backend.name} for pos-emb {m.pos_emb} on {device.type}/{dtype} (training)"


def launch_layout(cfg) -> list[str]:
    """What a launch of this config starts, for --dry-run: the launcher, each host with its slots
    and ranks, the process count; and a warning for each host whose name does not resolve here."""

    p = cfg.parallel
    if not needs_launcher(cfg):
        return ["launch: 1 process, here (no launcher)"]
    if not hostfile_in_use(p.hostfile):
        n = processes_per_node(cfg)
        return [f"launch: DeepSpeed's runner on this machine, {n} processes (ranks 0-{n - 1})"]
    slots = active_slots(p.hostfile, p.include, p.exclude)
    hosts = list(slots)[:p.num_nodes] if p.num_nodes else list(slots)
    total = sum(len(slots[h]) for h in hosts)
    check_slots(p.hostfile, p.include, p.exclude, p.num_gpus, p.num_nodes)  # refused at launch: said now
    master = (p.master_addr or hosts[0]) if len(hosts) > 1 else "127.0.0.1"
    lines = [f"launch: DeepSpeed's runner, launcher {p.launcher if len(hosts) > 1 else 'local'}, hostfile "
             f"{p.hostfile}: {len(hosts)} host(s), {total} processes, rendezvous {master}:{p.master_port}"]
    rank = 0
    for host in hosts:
        n = len(slots[host])
        lines.append(f"  {host}: slots {n}, ranks {rank}" + (f"-{rank + n - 1}" if n > 1 else ""))
        rank += n
    lines += [f"warning: host {h!r} does not resolve on this machine ({why}): the launch would fail; fix the "
              f"hostfile {p.hostfile!r} (or drop the host with `exclude:`)" for h, why in unresolved(hosts).items()]
    return lines


def main(argv: list[str] | None = None) -> int:
    """Raises ConfigError (every problem at once) before anything is written or started;
    deepy.py turns it into one message (megatron.errors.run_cli)."""

    argv = sys.argv[1:] if argv is None else argv
    if os.path.basename(script_named(argv) or "") == EVALUATE_SCRIPT and os.path.isfile(script_named(argv)):
        return evaluate_launch(argv)  # evaluate.py's flags are its own (--out is not deepy's --override)
    args = parse_args(argv)

    apply_trust_flag(args)
    if not os.path.isfile(args.user_script):  # before the configs: `deepy.py trian.py ...` is the first thing to fix

        raise UserError(f"script {args.user_script!r} not found (expected e.g. train.py or eval.py)"
                        + did_you_mean_file(args.user_script, (".py",)))
    cfg = load_config(config_paths(args), overrides=parse_overrides(args.override))
    check_model_size(cfg)
    backend_line = None if is_eval(args.user_script) else training_backend(cfg)
    if not is_eval(args.user_script):
        from megatron.training.data_setup import check_document_eod  # lazy: the data modules import numpy

        check_document_eod(cfg, build_tokenizer)  # the document keys' end-of-document token
    missing = input_problems(cfg)
    for note in (outside_run_dir(cfg), saves_nothing(cfg), unused_data_path(cfg),
                 missing_hostfile_warning(cfg.parallel.hostfile)):
        if note:
            print(f"deepy.py: {note}", flush=True)
    # a finished run started again: said by the dry run as by the launch (the trainer's own rule)
    finished = None if is_eval(args.user_script) else finished_iteration(cfg)
    if finished is not None:
        print(f"deepy.py: {finished_note(cfg, finished, recorded_changes(cfg))}", flush=True)
    if args.dry_run:
        dry_run(cfg)
        print("\n".join(([backend_line] if backend_line else []) + launch_layout(cfg)), flush=True)
    if missing:  # after a dry run's summary: "config OK; missing files only" (exit 3) or a config error
        raise inputs_error(missing)
    if args.dry_run:
        return 0

    if is_eval(args.user_script):
        return eval_launch(args, cfg)
    given = eval_argv(args, args.parser)
    if given:
        raise UserError(f"{' '.join(a for a in given if a.startswith('--'))}: only {EVAL_SCRIPT} takes these "
                        f"flags, not {args.user_script}")
    from megatron.process.disk import check_run_room  # lazy: pulls in torch; --help and config refusals need none

    for lock in training_locks(cfg):  # a live run's resolved config and configs/ are not replaced
        lock.check_free()
    check_training_start(cfg)  # a changed model is refused even when the run is finished
    if finished is not None:
        return 0  # nothing to run and nothing to write (megatron/training/finished.py)
    launched = needs_launcher(cfg)
    if launched:
        check_launch_hosts(cfg)  # slots and ssh to every host, before anything is written
    from megatron.process.disk import first_missing, remove_created  # lazy: as above

    created = first_missing(cfg.logging.run_dir)  # removed again if the launch is refused
    check_run_room(cfg)  # a full disk named now, not by the first write that fails
    # Staged: the training process publishes it once its own checks passed (config/originals.py)
    discard_stale_staging(cfg.logging.run_dir)  # a killed launcher's, left between staging and publishing
    resolved = staged_resolved_path(cfg.logging.run_dir)
    write_originals(cfg.config_files, os.path.dirname(resolved))  # found beside resolved_config.yml on load
    cfg.save(resolved)
    try:
        if launched:
            return launch_with_deepspeed(cfg, args.user_script, resolved)
        # One process: run the script here (no launcher needed; see megatron/process/distributed.py).
        sys.argv = [args.user_script, "--resolved-config", resolved]
        runpy.run_path(args.user_script, run_name="__main__")
        return 0
    finally:
        if discard_staged(resolved) and created:  # refused before training: nothing of this launch stays
            remove_created(created)


def check_training_start(cfg) -> None:
    """What the training processes would refuse before their first step, said here, before any
    process or process group starts (a refused launch on many processes took 90 s to say it): data
    written by another tokenizer, and about `load`/`save`: a changed model, a taken save directory,
    a missing step, another parallel layout (the same checks the trainer runs again)."""
    # lazy: the trainer's checks pull in torch; --help and config refusals need none
    from megatron.training.checkpoint import Checkpointer
    from megatron.training.data_setup import check_data_tokenizer

    check_data_tokenizer(cfg)
    vocab, _ = dry_vocab(cfg)  # None (unreadable tokenizer files): the padded vocab is not compared
    Checkpointer(cfg, vocab, is_rank0=False).check(quiet=True)


def needs_launcher(cfg) -> bool:
    """Several processes, or a hostfile: DeepSpeed's runner; else this process runs the script."""

    p = cfg.parallel
    return processes_per_node(cfg) > 1 or bool(hostfile_in_use(p.hostfile)) or (p.num_nodes or 1) > 1


def check_launch_hosts(cfg) -> None:
    """With a hostfile: its slots agree with num-gpus/num-nodes, and ssh reaches every host."""

    p = cfg.parallel
    if hostfile_in_use(p.hostfile):
        check_slots(p.hostfile, p.include, p.exclude, p.num_gpus, p.num_nodes)
        check_hosts(p.hostfile, p.include, p.exclude)


def remote_hosts(cfg) -> list[str]:
    """The hosts of a launch across hosts (the runner's multi-node case), else []."""

    p = cfg.parallel
    if not hostfile_in_use(p.hostfile):
        return []
    hosts = active_hosts(p.hostfile, p.include, p.exclude)
    if p.num_nodes:
        hosts = hosts[:p.num_nodes]
    return hosts if len(hosts) > 1 else []


def processes_per_node(cfg) -> int:
    """num_gpus, else every visible GPU (NeoX), else one process (a CPU run: no GPU, or device: cpu)."""
    import torch  # lazy: torch; --help and config refusals need none

    if cfg.parallel.num_gpus:
        return cfg.parallel.num_gpus
    return torch.cuda.device_count() if resolve_device(cfg.parallel.device, "device:").type == "cuda" else 1


def runner_args(cfg, user_script: str, resolved: str, master_addr: str | None = None,
                script_args: list[str] = ()) -> list[str]:
    """The DeepSpeed runner's command line for this config (only the options that are set)."""

    p = cfg.parallel
    out = []
    if p.hostfile:  # passed on when missing too: the runner then trains locally, as we announced
        out += ["--hostfile", p.hostfile]
    if p.include:
        out += ["--include", p.include]
    if p.exclude:
        out += ["--exclude", p.exclude]
    if p.num_nodes and not (p.include or p.exclude):
        out += ["--num_nodes", str(p.num_nodes)]
    if p.num_gpus and not (p.include or p.exclude or hostfile_in_use(p.hostfile)):  # else the slots decide
        out += ["--num_gpus", str(p.num_gpus)]
    if master_addr or p.master_addr:
        out += ["--master_addr", master_addr or p.master_addr]
    if hostfile_in_use(p.hostfile):
        out += ["--no_ssh_check"]  # check_launch_hosts asked every host, the runner would ask the first again
    out += ["--master_port", str(p.master_port), "--launcher", p.launcher]
    hosts = remote_hosts(cfg)
    if hosts:  # the rendezvous for processes the runner starts itself (megatron/launchers/: mpirun's)
        out += launcher(p.launcher).runner_arguments(master_addr or p.master_addr or hosts[0], p.master_port)
    # The runner's INFO lines repeat what deepy.py prints (megatron/console.py); its warnings stay.
    out += ["--log_level", "info" if debug_enabled() else "warning"]

    # On other nodes the runner exports only a few variables, so KERPLE_DEBUG and the trust
    # switch travel as flags.
    debug = [DEBUG_FLAG] if debug_enabled() else []
    trust = ["--trust-checkpoint"] if trusted_from_env() else []
    return out + [user_script, "--resolved-config", resolved, *debug, *trust, *script_args]


def launch_with_deepspeed(cfg, user_script: str, resolved: str, script_args: list[str] = ()) -> int:
    """N processes through DeepSpeed's runner (pdsh/openmpi/slurm across nodes, local otherwise).

    The workers read the resolved config file, so on several nodes `run-dir` must be on a shared
    filesystem (as NeoX's `use_shared_fs`)."""

    set_op_cache_dir()  # workers inherit the op cache
    worker_environment(resolve_device(cfg.parallel.device, "device:"))  # and DeepSpeed's accelerator
    from deepspeed.launcher import runner  # lazy: DeepSpeed, only to launch

    hosts = remote_hosts(cfg)
    # Across hosts the rendezvous is the first host unless set (the runner would ask it over ssh
    # for `hostname -I`); deepy.py must know it: signals reach the workers through its store.
    master_addr = (cfg.parallel.master_addr or hosts[0]) if hosts else None
    if hosts:

        os.environ["PDSH_SSH_ARGS_APPEND"] = " ".join(
            filter(None, [os.environ.get("PDSH_SSH_ARGS_APPEND"), ssh_keepalive(cfg.parallel.lost_host_timeout)]))
    if hosts:  # what the launcher's processes need to find the rendezvous (megatron/launchers/: srun's)
        os.environ.update(launcher(cfg.parallel.launcher).rendezvous_environment(master_addr, cfg.parallel.master_port))
    argv = runner_args(cfg, user_script, resolved, master_addr, script_args)  # script_args: evaluate.py's flags
    if not cfg.parallel.hostfile:  # the runner's default /job/hostfile: no hostfile was asked for

        drop_log_message(MISSING_HOSTFILE)
    print("deepy.py: deepspeed " + " ".join(argv), flush=True)
    # A signal to deepy.py reaches the workers, which save and exit, and deepy.py waits for them
    # (launch/signals.py); the local launcher gets a process group of its own, so a Ctrl-C in the
    # terminal reaches the workers once, through deepy.py.
    supervisor = Supervisor(StopReport(cfg), rendezvous=(master_addr, cfg.parallel.master_port) if hosts else None)
    relays: list = []
    try:
        with supervisor, launcher_in_own_group(runner) as relays:
            rc = runner.main(argv)
    except SystemExit as e:  # the runner exits with the workers' status
        rc = e.code
    except (RuntimeError, ValueError, subprocess.CalledProcessError) as e:  # its checks, as tracebacks
        raise UserError(f"DeepSpeed's runner could not launch: {' '.join(str(e).split())[:400]}; check `hostfile:`, "
                        "`include:`/`exclude:`, `num-gpus:` and `master-addr:`") from e
    finally:
        remove_launch_buffers(cfg.parallel.master_port)  # the workers have exited: DeepSpeed leaves these
    return supervisor.exit_code or last_words(relays) or int(rc or 0)


def last_words(relays: list) -> int | None:
    """Print what ends a remote launch's output (the lost host's line, else the launcher's own exit
    lines); EXIT_LOST_HOST when a host was lost."""
    lost = None
    for relay in relays:
        for line in relay.last_words():
            print(line, file=sys.stderr, flush=True)
        lost = lost or (EXIT_LOST_HOST if relay.verdict else None)
    return lost


def config_from_cli(parser, args):
    """The NeoXConfig an entry point (train.py, eval.py) was given: config files plus -o overrides,
    or the --resolved-config a launcher wrote. Exactly one of the two."""

    if bool(args.resolved_config) == bool(args.conf_file):
        parser.error("give either config files or --resolved-config")
    if args.resolved_config:
        return NeoXConfig.from_file(args.resolved_config)
    return load_config(args.conf_file, overrides=parse_overrides(args.override))
