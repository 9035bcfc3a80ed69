"""Slurm on a test cluster (tests/cluster/netns_cluster.py): a munged on every host (one shared key),
slurmctld on the first host, a slurmd on each; one CPU partition `cpu` holding every host.

Everything lives in the cluster's directory; each host's mount namespace sees the cluster's
slurm.conf as /etc/slurm/slurm.conf, so `sbatch`, `srun`, `squeue` and `scontrol` run on a host
exactly as a user types them. The daemons run as root (slurmctld's and slurmd's usual user on a
small cluster; munged with --force), with process tracking by /proc (no cgroups in a namespace).
"""
from __future__ import annotations

import os
import time

CPUS = 2  # per host: slurmd refuses a node configured with more CPUs than it sees


def slurm_conf(cluster) -> str:
    d = cluster.dir
    first = cluster.hosts[0]
    nodes = "".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={CPUS} State=UNKNOWN\n" for h in cluster.hosts)
    return (f"ClusterName={cluster.tag}\nSlurmctldHost={first.name}({first.address})\n"
            "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
            # a requeued job starts again after the credential lifetime (default 120 s): short here
            "AuthInfo=cred_expire=10\n"
            f"StateSaveLocation={d}/slurmctld\nSlurmdSpoolDir={d}/slurmd_%n\n"
            f"SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd_%n.pid\n"
            f"SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd_%n.log\n"
            "SlurmctldPort=6817\nSlurmdPort=6818\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nMpiDefault=none\n"
            "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
            "SchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "ReturnToService=2\nInactiveLimit=0\nKillWait=30\nMinJobAge=300\nSlurmdTimeout=30\n"
            "SchedulerParameters=sched_interval=1\nJobRequeue=1\n"
            + nodes + "PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")


def write_files(cluster) -> None:
    """slurm.conf (mounted over /etc/slurm by the hosts' set-up) and the munge key."""
    d = cluster.dir
    os.makedirs(os.path.join(d, "etc_slurm"))
    os.makedirs(os.path.join(d, "slurmctld"))
    for h in cluster.hosts:
        os.makedirs(os.path.join(d, f"slurmd_{h.name}"))
    with open(os.path.join(d, "etc_slurm", "slurm.conf"), "w") as f:
        f.write(slurm_conf(cluster))
    with open(os.path.join(d, "etc_slurm", "cgroup.conf"), "w") as f:
        f.write("CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n")
    key = os.path.join(d, "munge.key")
    with open(key, "wb") as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o400)


def start_slurm(cluster) -> None:
    d = cluster.dir
    for h in cluster.hosts:
        cluster.start_daemon(h, ["/usr/sbin/munged", "--force", "-F", f"--key-file={d}/munge.key",
                                 f"--pid-file={d}/munged_{h.name}.pid", f"--log-file={d}/munged_{h.name}.log",
                                 f"--seed-file={d}/munged_{h.name}.seed"], log=f"munged_{h.name}.out")
    for h in cluster.hosts:
        _wait(lambda h=h: cluster.run(h, ["sh", "-c", "munge -n | unmunge"], check=False).returncode == 0,
              f"munged on {h.name}", cluster, f"munged_{h.name}.out")
    cluster.start_daemon(cluster.hosts[0], ["/usr/sbin/slurmctld", "-D", "-i"], log="slurmctld.out")
    for h in cluster.hosts:
        cluster.start_daemon(h, ["/usr/sbin/slurmd", "-D", "-N", h.name], log=f"slurmd_{h.name}.out")

    def nodes_idle():
        out = cluster.run(cluster.hosts[0], ["sinfo", "-h", "-N", "-o", "%N %t"], check=False).stdout.split("\n")
        states = dict(line.split() for line in out if line.strip())
        return len(states) == len(cluster.hosts) and all(s == "idle" for s in states.values())

    try:
        _wait(nodes_idle, "every slurmd registered and idle", cluster, "slurmctld.log", timeout=60)
    except RuntimeError as e:
        raise RuntimeError(f"{e}\n{cluster.log('slurmd_h1.log')}\n{cluster.log('slurmd_h1.out')}\n"
                           + cluster.run(cluster.hosts[0], ["sinfo", "-N", "-l"], check=False).stdout) from None


def _wait(ready, what: str, cluster, log: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"test cluster: {what}: not within {timeout:.0f} s\n{cluster.log(log)}")
        time.sleep(0.2)


def job_state(cluster, job_id: str) -> str:
    """The job's state (PENDING, RUNNING, COMPLETED, FAILED, ...) as scontrol tells it."""
    out = cluster.run(cluster.hosts[0], ["scontrol", "show", "job", job_id], check=False).stdout
    for field in out.split():
        if field.startswith("JobState="):
            return field.split("=", 1)[1]
    return "UNKNOWN"


def submit(cluster, args: list[str], cwd: str, env: dict | None = None) -> str:
    """`sbatch ARGS` on the first host from `cwd`: the job id."""
    out = cluster.run(cluster.hosts[0], ["sbatch", "--parsable", *args], cwd=cwd, env=env).stdout.strip()
    return out.split(";")[0]


def wait_job(cluster, job_id: str, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"),
             timeout: float = 300) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = job_state(cluster, job_id)
        if state in states or time.monotonic() > deadline:
            return state
        time.sleep(0.5)

