"""Fixtures of the multi-host tests: one cluster of network-namespace hosts per test module
(tests/cluster/netns_cluster.py), removed at the module's end; runs started on its first host as a
user would start them there. `make test-cluster` runs these (as root, where `ip netns` works)."""
from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from tests.cluster.netns_cluster import Cluster, missing_packages, why_not_available
from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml
from tests.integration.fault_helpers import child_env

# Short enough for the tests' clock, long enough for two busy cores: a lost host ends the run
# within about this plus one beat (megatron/process/heartbeat.py).
LOST_HOST_TIMEOUT = 20
# Steps of a test run: a signal or a lost host at step 12 comes well before the end, also on busy cores.
TRAIN_ITERS = 60


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: needs a test cluster of network namespaces (root); make test-cluster")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.cluster)


def _cluster(slurm: bool):
    why = why_not_available()
    missing = missing_packages(slurm)
    if why or missing:
        pytest.skip(f"no test cluster here: {why or 'missing packages ' + ', '.join(missing)} (make test-cluster installs them)")
    return Cluster(2, slurm=slurm)


@pytest.fixture(scope="module")
def cluster():
    with _cluster(slurm=False) as c:
        yield c


@pytest.fixture(scope="module")
def slurm_cluster():
    with _cluster(slurm=True) as c:
        yield c


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The cluster's shared filesystem: data and runs of the module's tests."""
    d = tmp_path_factory.mktemp("shared")
    os.chmod(d, 0o755)
    return d


@pytest.fixture(scope="module")
def dataset(shared):
    return write_token_dataset(str(shared / "tiny_text_document"))


def run_config(shared, dataset, name: str, **over) -> str:
    """A tiny training run on CPU, saving every 5 steps into <shared>/<name>/checkpoints, loading
    from there (the same command resumes), with dropout so an exact resume means exact masks."""
    run = shared / name
    ck = str(run / "checkpoints")
    data = train_config_dict(shared, dataset, **{
        "train_iters": TRAIN_ITERS, "save": ck, "load": ck, "save_interval": 5, "run_dir": str(run),
        "hidden_dropout": 0.1, "attention_dropout": 0.1, "lost_host_timeout": LOST_HOST_TIMEOUT, **over})
    return write_yaml(shared / f"{name}.yml", data)


def hostfile(shared, *lines: str) -> str:
    path = shared / "hostfile"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


class Launch:
    """`python deepy.py ...` on a host: its output line by line as it comes (a thread reads it)."""

    def __init__(self, cluster, host, args: list[str], env: dict | None = None):
        self.started = time.monotonic()
        self.proc = cluster.popen(host, [sys.executable, *args], cwd=ROOT, env=env or child_env())
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"never printed {text!r}:\n{self.output[-4000:]}")
            time.sleep(0.05)

    def finish(self, timeout: float = 300) -> tuple[int, float]:
        """(exit status, seconds since start)."""
        try:
            self.proc.wait(timeout=timeout)
        except Exception:
            self.proc.kill()
            raise
        self._reader.join(10)
        return self.proc.returncode, time.monotonic() - self.started


def deepy(cluster, host, script: str, *configs: str, env: dict | None = None) -> Launch:
    return Launch(cluster, host, [os.path.join(ROOT, "deepy.py"), script, *configs], env=env)


def wait_until_gone(cluster, containing: str, timeout: float) -> dict[str, list[str]]:
    """Every host's processes whose command line contains `containing`, once none is left or at
    `timeout` (then what is left, by host)."""
    deadline = time.monotonic() + timeout
    while True:
        left = {h.name: cluster.commands(h, containing) for h in cluster.hosts}
        if not any(left.values()) or time.monotonic() > deadline:
            return {k: v for k, v in left.items() if v}
        time.sleep(0.2)
