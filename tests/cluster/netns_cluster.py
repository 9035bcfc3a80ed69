"""A cluster of N hosts on this one machine, for the multi-host tests (tests/cluster/).

Each host is a set of Linux namespaces held by one process of ours:
- its own network namespace, joined by a veth pair to a private bridge that lives in a namespace of
  its own (the "switch"), so the hosts reach each other and nothing else: the machine's own network
  namespace is never touched, and cutting a host off is `link down` on its switch port;
- its own UTS namespace (its hostname) and mount namespace, in which /etc/hosts (every host of the
  cluster), /etc/passwd (root's home in the cluster's directory, so ssh finds the cluster's key in
  ~/.ssh and no file of this machine's /root is written), a fresh /run and a fresh /dev/shm are
  mounted. Nothing outside the mount namespace sees them: no global file is changed.
- its own sshd (public key only, the cluster's key), and for the Slurm tests a munged and a slurmd,
  with slurmctld on the first host (Debian's packages: `install_packages()` apt-gets what is missing).

The file system is the machine's: the repository and the test's tmp directory are the "shared
filesystem" a real cluster's run directory lives on.

`Cluster.close()` kills every process inside the cluster's network namespaces (all of them started
here: the holders, the daemons and whatever ssh ran on the hosts), deletes the namespaces and the
cluster's directory. Used as a context manager; also from the command line for a look by hand:

    python -m tests.cluster.netns_cluster --hosts 2 [--slurm]   # builds one, prints how to enter it, waits for Ctrl-C
    python -m tests.cluster.netns_cluster --check               # can this machine build one? (else why)
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass

# The packages a cluster needs (Debian's names) and a command of each that says it is installed.
PACKAGES = {"openssh-server": "/usr/sbin/sshd", "openssh-client": "/usr/bin/ssh", "pdsh": "/usr/bin/pdsh",
            "iproute2": "/usr/sbin/ip", "util-linux": "/usr/bin/nsenter", "openmpi-bin": "/usr/bin/mpirun"}
SLURM_PACKAGES = {"slurm-wlm": "/usr/sbin/slurmctld", "munge": "/usr/sbin/munged"}


def missing_packages(slurm: bool = False) -> list[str]:
    wanted = {**PACKAGES, **(SLURM_PACKAGES if slurm else {})}
    return [pkg for pkg, path in wanted.items() if not os.path.exists(path)]


def install_packages(slurm: bool = False) -> None:
    """apt-get what is missing (CI runs as root on a fresh Debian machine)."""
    missing = missing_packages(slurm)
    if not missing:
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


def why_not_available() -> str | None:
    """None when this machine can build a cluster, else the reason in a few words."""
    if os.geteuid() != 0:
        return "not root"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "iproute2 / util-linux missing"
    name = f"kcprobe{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`ip netns add` fails: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


@dataclass
class Host:
    name: str  # its hostname
    address: str
    netns: str
    port: str  # its switch port (a veth in the switch namespace): down = cut off the network
    holder: subprocess.Popen | None = None  # the process that holds its UTS and mount namespaces

    def enter(self, cwd: str | None = None) -> list[str]:
        """The command prefix that runs a command on this host, in `cwd` (default: ours; entering
        the mount namespace would otherwise start it in /)."""
        return ["nsenter", "-t", str(self.holder.pid), "-n", "-u", "-m", f"--wd={cwd or os.getcwd()}", "--"]


class Cluster:
    """N hosts h1..hN (addresses 10.<a>.<b>.1..N/24 on a private bridge)."""

    def __init__(self, hosts: int = 2, slurm: bool = False, tag: str | None = None):
        self.tag = tag or f"kc{os.getpid() % 100000}"
        self.dir = tempfile.mkdtemp(prefix=f"{self.tag}-")
        os.chmod(self.dir, 0o755)  # sshd refuses keys under a directory others could write
        self.switch = f"{self.tag}-sw"
        octet = 100 + os.getpid() % 100  # 10.213.<octet>.0/24: private, and differs between concurrent runs
        self.hosts = [Host(f"h{i}", f"10.213.{octet}.{i}", f"{self.tag}-h{i}", f"{self.tag}p{i}") for i in range(1, hosts + 1)]
        self.daemons: list[subprocess.Popen] = []
        self.slurm = slurm
        self.home = os.path.join(self.dir, "home")  # root's home on every host: ~/.ssh holds the cluster's key

    # ----------------------------------------------------------------- building
    def __enter__(self) -> Cluster:
        try:
            self._network()
            self._files()
            if self.slurm:
                from tests.cluster.slurm import write_files

                write_files(self)
            for host in self.hosts:
                self._start_holder(host)
            for host in self.hosts:
                self._start_sshd(host)
            self.wait_for_ssh()
            if self.slurm:
                from tests.cluster.slurm import start_slurm

                start_slurm(self)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _network(self) -> None:
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        for host in self.hosts:
            _run(["ip", "netns", "add", host.netns])
            _run(["ip", "-n", self.switch, "link", "add", host.port, "type", "veth", "peer", "name", "eth0",
                  "netns", host.netns])
            _run(["ip", "-n", self.switch, "link", "set", host.port, "master", "br0", "up"])
            _run(["ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0"])
            _run(["ip", "-n", host.netns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", host.netns, "link", "set", "lo", "up"])

    def _files(self) -> None:
        d = self.dir
        with open(os.path.join(d, "hosts"), "w") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts))
        with open("/etc/passwd") as f:  # root's home -> the cluster's: ssh reads ~/.ssh from the passwd entry
            lines = [ln.split(":") for ln in f.read().splitlines()]
        with open(os.path.join(d, "passwd"), "w") as f:
            f.write("".join(":".join(p[:5] + [self.home] + p[6:] if p[0] == "root" else p) + "\n" for p in lines))
        ssh = os.path.join(self.home, ".ssh")
        os.makedirs(ssh, mode=0o700)
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.tag, "-f", os.path.join(ssh, "id_ed25519")])
        shutil.copy(os.path.join(ssh, "id_ed25519.pub"), os.path.join(ssh, "authorized_keys"))
        with open(os.path.join(ssh, "config"), "w") as f:  # what a cluster's admin sets up for its users
            f.write("Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(d, "ssh_host_ed25519_key")])

    def _start_holder(self, host: Host) -> None:
        """A process in the host's network namespace with new UTS and mount namespaces, set up as
        the host, then asleep: everything run on the host enters its namespaces (Host.enter)."""
        d = self.dir
        # Slurm: the cluster's /etc/slurm; slurmd 22.05 initializes its cgroup plugin whatever the
        # process tracking, and `ip netns exec` gave the host a /sys without cgroups: an empty tmpfs
        # there (the v1 plugin, named in cgroup.conf, only looks; nothing is created in it).
        slurm = (f" && mount --bind {d}/etc_slurm /etc/slurm && mount -t tmpfs tmpfs /sys/fs/cgroup"
                 if self.slurm else "")
        setup = (f"hostname {host.name} && mount --bind {d}/hosts /etc/hosts && mount --bind {d}/passwd /etc/passwd"
                 " && mount -t tmpfs tmpfs /run && mkdir -m 755 /run/sshd /run/munge"
                 f" && mount -t tmpfs tmpfs /dev/shm{slurm} && exec sleep infinity")
        host.holder = subprocess.Popen(["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount",
                                        "--propagation", "private", "sh", "-c", setup],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # ready once its hostname is set and the mounts are made
            if host.holder.poll() is not None:
                raise RuntimeError(f"{host.name}: setting up the host failed: {host.holder.stderr.read().decode()}")
            probe = subprocess.run([*host.enter(), "sh", "-c", "hostname; test -d /run/sshd && grep -q h1 /etc/hosts"],
                                   capture_output=True, text=True)
            if probe.returncode == 0 and probe.stdout.strip() == host.name:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{host.name}: the host did not come up within 10 s")

    def _start_sshd(self, host: Host) -> None:
        d = self.dir
        config = os.path.join(d, f"sshd_{host.name}.conf")
        with open(config, "w") as f:
            f.write(f"ListenAddress {host.address}\nListenAddress 127.0.0.1\nHostKey {d}/ssh_host_ed25519_key\n"
                    "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                    "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
                    f"PidFile {d}/sshd_{host.name}.pid\nAcceptEnv KERPLE_*\n"
                    # a cluster's sshd notices a client that is gone (the usual setting): the
                    # sessions of a host cut off end instead of holding their processes
                    "ClientAliveInterval 5\nClientAliveCountMax 3\nMaxStartups 100\nMaxSessions 100\n")
        self.start_daemon(host, ["/usr/sbin/sshd", "-D", "-e", "-f", config], log=f"sshd_{host.name}.log")

    def start_daemon(self, host: Host, cmd: list[str], log: str, env: dict | None = None) -> subprocess.Popen:
        out = open(os.path.join(self.dir, log), "ab")
        proc = subprocess.Popen([*host.enter(self.dir), *cmd], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                env=env)
        out.close()
        self.daemons.append(proc)
        return proc

    def wait_for_ssh(self, timeout: float = 20) -> None:
        first = self.hosts[0]
        for host in self.hosts:
            deadline = time.monotonic() + timeout
            while True:
                probe = self.run(first, ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=2", host.name, "hostname"],
                                 check=False, timeout=10)
                if probe.returncode == 0 and probe.stdout.strip() == host.name:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ssh {first.name} -> {host.name} does not work: {probe.stderr.strip()}\n"
                                       + self.log(f"sshd_{host.name}.log"))
                time.sleep(0.2)

    # ----------------------------------------------------------------- using
    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def run(self, host: Host, cmd: list[str], check: bool = True, cwd: str | None = None,
            **kw) -> subprocess.CompletedProcess:
        proc = subprocess.run([*host.enter(cwd), *cmd], capture_output=True, text=True, **kw)
        if check and proc.returncode != 0:
            raise AssertionError(f"on {host.name}: {' '.join(cmd)} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def popen(self, host: Host, cmd: list[str], cwd: str | None = None, **kw) -> subprocess.Popen:
        """`cmd` started on `host` (stdout and stderr together, text), in a process group of its own
        so a test can signal it like a terminal would."""
        return subprocess.Popen([*host.enter(cwd), *cmd], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, process_group=0, **kw)

    def cut_off(self, host: Host) -> None:
        """The host drops off the network: its processes go on, nothing reaches it."""
        _run(["ip", "-n", self.switch, "link", "set", host.port, "down"])

    def reconnect(self, host: Host) -> None:
        _run(["ip", "-n", self.switch, "link", "set", host.port, "up"])

    def pids(self, host: Host) -> list[int]:
        """Every process in the host's network namespace (ours: the holder, daemons, what ssh ran)."""
        try:
            want = os.stat(f"/run/netns/{host.netns}").st_ino
        except FileNotFoundError:
            return []
        out = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{pid}/ns/net").st_ino == want:
                        out.append(int(pid))
        return out

    def commands(self, host: Host, containing: str) -> list[str]:
        """The command lines of the host's processes that contain `containing`."""
        out = []
        for pid in self.pids(host):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    line = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
                if containing in line:
                    out.append(f"{pid}: {line}")
        return out

    def kill_matching(self, host: Host, containing: str, sig=signal.SIGKILL) -> list[int]:
        """Signal the host's processes whose command line contains `containing` (a crash)."""
        hit = [int(line.split(":", 1)[0]) for line in self.commands(host, containing)]
        for pid in hit:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        return hit

    def log(self, name: str) -> str:
        with contextlib.suppress(OSError), open(os.path.join(self.dir, name), errors="replace") as f:
            return f"--- {name} ---\n" + f.read()[-3000:]
        return ""

    # ----------------------------------------------------------------- removing
    def close(self) -> None:
        for host in self.hosts:  # everything in the hosts' namespaces was started by this cluster
            for pid in self.pids(host):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.daemons + [h.holder for h in self.hosts if h.holder]:
            with contextlib.suppress(Exception):
                proc.kill()
                proc.wait(timeout=10)
        for ns in [h.netns for h in self.hosts] + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def main() -> None:
    import argparse
    import sys

    p = argparse.ArgumentParser(description="Build a test cluster and wait (Ctrl-C removes it); or check/prepare "
                                            "this machine for one.")
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--slurm", action="store_true")
    p.add_argument("--check", action="store_true", help="exit 0 if a cluster can be built here, else say why (exit 1)")
    p.add_argument("--install", action="store_true", help="apt-get the packages a cluster needs (Slurm's too), then exit")
    args = p.parse_args()
    if args.install:  # before --check: iproute2 itself may be missing
        try:
            install_packages(slurm=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"apt-get could not install {', '.join(missing_packages(slurm=True))}: {e}")
            sys.exit(1)
    if args.check:
        why = why_not_available() or (", ".join(missing_packages(slurm=True)) + " missing"
                                      if missing_packages(slurm=True) else None)
        if why:
            print(why)
            sys.exit(1)
    if args.check or args.install:
        return
    install_packages(args.slurm)
    with Cluster(args.hosts, slurm=args.slurm) as c:
        print(f"cluster {c.tag}: " + ", ".join(f"{h.name} {h.address}" for h in c.hosts))
        print(f"enter a host: {' '.join(c.hosts[0].enter())} bash")
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
