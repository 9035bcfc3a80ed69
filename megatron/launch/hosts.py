"""The hosts of a multi-node launch, checked before DeepSpeed's runner starts anything.

The runner ssh-checks only the first host of the hostfile and reports it as a RuntimeError
traceback (another unreachable host fails later, inside pdsh, with the workers half started).
Here every active host (after include/exclude) is asked `ssh -o BatchMode=yes host true` at once,
in parallel, with a short timeout: one message lists each unreachable host with ssh's reason.

A hostfile that does not exist is not an error, as in DeepSpeed's runner (fetch_hostfile): it
warns and trains on this machine's GPUs (or CPUs). NeoX's own configs rely on it
(`hostfile: /mock_path`). deepy.py prints the runner's warning itself, also on one process,
where the runner is never started; more than one node without the hostfile is refused before
launching (megatron/config/inputs.py), where the runner would stop with a ValueError.
"""
from __future__ import annotations

import os
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as LookupTimeout

from megatron.errors import UserError

SSH_TIMEOUT_S = 10
# deepspeed/launcher/runner.py fetch_hostfile's warning, word for word (tests/unit/test_hostfile_missing.py)
MISSING_HOSTFILE = "Unable to find hostfile, will proceed with training with local resources only."


def hostfile_in_use(hostfile: str | None) -> str | None:
    """The hostfile when it exists; None when unset or missing (then this machine only)."""
    return hostfile if hostfile and os.path.isfile(hostfile) else None


def missing_hostfile_warning(hostfile: str | None) -> str | None:
    """The warning for a hostfile that is set and does not exist, else None."""
    if not hostfile or hostfile_in_use(hostfile):
        return None
    return f"hostfile {hostfile!r} does not exist. {MISSING_HOSTFILE} (as DeepSpeed's runner does)"


def active_slots(hostfile: str, include: str | None, exclude: str | None) -> dict[str, list[int]]:
    """host -> the slots (process indices) DeepSpeed's runner will use there, after include/exclude."""
    # lazy: DeepSpeed; deepy.py's --help and config refusals need none
    from deepspeed.launcher.runner import fetch_hostfile, parse_inclusion_exclusion

    try:
        pool = fetch_hostfile(hostfile)
        active = dict(parse_inclusion_exclusion(pool, include or "", exclude or "")) if pool else {}
    except ValueError as e:  # the runner's own words name the bad line or host
        raise UserError(f"hostfile {hostfile!r}: {e}; fix `hostfile:` (lines: `<host> slots=<n>`) or "
                        "`include:`/`exclude:`") from None
    # Degenerate host sets the runner would take and then fail on deep inside (a 25-line traceback):
    # refused here, where the dry run and every launch path read the slots.
    empty = [h for h, s in active.items() if not s]
    if empty:
        raise UserError(f"hostfile {hostfile!r}: host {empty[0]} would run no process (slots=0, or every slot "
                        "excluded); give it slots=<n> >= 1, or remove it from the hostfile (or `exclude:` the host)")
    if pool and not active:
        raise UserError(f"include: {include or '-'} / exclude: {exclude or '-'} leave no host of the hostfile "
                        f"{hostfile!r} (its hosts: {', '.join(pool)}); the launch would start no process: fix "
                        "`include:`/`exclude:`")
    return active


def active_hosts(hostfile: str, include: str | None, exclude: str | None) -> list[str]:
    """The hostfile's hosts left by include/exclude, as DeepSpeed's runner will pick them."""
    return list(active_slots(hostfile, include, exclude))


def check_slots(hostfile: str, include: str | None, exclude: str | None, num_gpus: int | None,
                num_nodes: int | None) -> None:
    """The hostfile's slots decide how many processes each host runs. DeepSpeed's runner lets
    `--num_gpus` override them silently (num-gpus: 8 on hosts with slots=1 started 8 CPU processes
    a host): a num-gpus or num-nodes that disagrees is refused, naming both."""
    slots = active_slots(hostfile, include, exclude)
    listed = ", ".join(f"{h} slots={len(s)}" for h, s in slots.items())
    if num_gpus is not None and any(len(s) != num_gpus for s in slots.values()):
        raise UserError(f"num-gpus: {num_gpus} disagrees with the hostfile {hostfile!r} ({listed}): the hostfile's "
                        "slots decide how many processes each host runs; remove `num-gpus` (or set it to the slots), "
                        "or fix the slots in the hostfile")
    if num_nodes is not None and num_nodes > len(slots):
        raise UserError(f"num-nodes: {num_nodes} but the hostfile {hostfile!r} has {len(slots)} usable host(s) ({listed}); "
                        "lower `num-nodes` or add the hosts to the hostfile")


def ssh_keepalive(lost_host_timeout: float) -> str:
    """ssh options for the launcher's connections: a connection to a host that dropped off the
    network ends within about a quarter of `lost-host-timeout` (else ssh waits on TCP for hours);
    BatchMode: never a password prompt nobody answers."""
    interval = max(1, int(lost_host_timeout / 12))
    return f"-o ServerAliveInterval={interval} -o ServerAliveCountMax=3 -o BatchMode=yes"


def unreachable(host: str, port: int | None = None) -> str | None:
    """Why `host` cannot be reached by passwordless ssh, or None when it can."""
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}", *(["-p", str(port)] if port else []),
           host, "true"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SSH_TIMEOUT_S + 5, check=False)
    except FileNotFoundError:
        return "ssh is not installed on this machine"
    except subprocess.TimeoutExpired:
        return f"no answer within {SSH_TIMEOUT_S + 5}s"
    if proc.returncode == 0:
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"ssh exited with status {proc.returncode}"


def unresolved(hosts: list[str], timeout_s: float = 5.0) -> dict[str, str]:
    """host -> why its name does not resolve on this machine (getaddrinfo), for each that does not;
    a lookup still running after `timeout_s` counts as not resolving."""
    def lookup(host: str) -> str | None:
        try:
            socket.getaddrinfo(host, None)
            return None
        except (socket.gaierror, UnicodeError) as e:
            return str(e.args[-1] if e.args else e)

    pool = ThreadPoolExecutor(max_workers=min(max(len(hosts), 1), 32))
    futures = {h: pool.submit(lookup, h) for h in hosts}
    reasons = {}
    for host, future in futures.items():
        try:
            reasons[host] = future.result(timeout=timeout_s)
        except LookupTimeout:
            reasons[host] = f"no answer within {timeout_s:.0f}s"
    pool.shutdown(wait=False)
    return {h: r for h, r in reasons.items() if r}


def check_hosts(hostfile: str, include: str | None = None, exclude: str | None = None) -> None:
    """UserError listing every active host of `hostfile` that ssh cannot reach, with the fix."""
    hosts = active_hosts(hostfile, include, exclude)
    if not hosts:
        return
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        reasons = dict(zip(hosts, pool.map(unreachable, hosts)))
    bad = {h: r for h, r in reasons.items() if r}
    if bad:
        listed = "; ".join(f"{h}: {r}" for h, r in bad.items())
        raise UserError(f"hostfile {hostfile!r}: {len(bad)} of {len(hosts)} hosts cannot be reached by passwordless "
                        f"ssh ({listed}). Fix the host names in the hostfile (or drop them with `exclude:`), set up "
                        "passwordless ssh to them (`ssh <host> true` must work without a prompt), or, on one node, "
                        "remove `hostfile:`")
