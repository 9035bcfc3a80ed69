"""Training through Slurm on two nodes, as docs/clusters.md tells a user to: `sbatch
tools/slurm/train.sbatch run.yml` from the repository, on a CPU partition.

- the job trains data parallel 2 (one task per node, ranks from Slurm's task variables) and
  gives the losses of the same run through pdsh-free local launch of two processes;
- pre-emption: `scancel --signal=USR1 --batch` (what `--signal=B:USR1@300` sends before the time
  limit) reaches the workers on both nodes, they save, the job requeues itself and its next start
  resumes exactly;
- several srun tasks that each see WORLD_SIZE=1 are refused by name.
"""
import os
import time

import pytest

from megatron.checkpoint.tags import read_latest, step_of
from tests.cluster.conftest import deepy, run_config
from tests.cluster.slurm import job_state, submit, wait_job
from tests.conftest import ROOT
from tests.integration.fault_helpers import child_env, train_losses

ITERS = 120  # long enough that a signal sent at step 12 arrives before the end, also on busy cores
SBATCH = os.path.join("tools", "slurm", "train.sbatch")
SAVE_STARTS_WITHIN_S = 5  # from `scancel --signal=USR1` to the save's first line, with steps of ~0.3-1 s


def job_log(shared, job_id: str) -> str:
    path = shared / f"kerple-{job_id}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def sbatch_train(cluster, shared, cfg: str) -> str:
    """docs/clusters.md's command, from the repository; its log in the shared directory (a test must not
    write into the repository)."""
    return submit(cluster, ["--output", str(shared / "kerple-%j.out"), SBATCH, cfg], cwd=ROOT, env=child_env())


@pytest.fixture(scope="module")
def reference(slurm_cluster, shared, dataset):
    """The same run as two processes on one node (deepy.py's local launch)."""
    launch = deepy(slurm_cluster, slurm_cluster.hosts[0], "train.py",
                   run_config(shared, dataset, "local", num_gpus=2, train_iters=ITERS))
    rc, _ = launch.finish()
    assert rc == 0, launch.output[-4000:]
    losses = train_losses(shared / "local")
    assert sorted(losses) == list(range(1, ITERS + 1))
    return losses


def test_sbatch_trains_data_parallel_over_two_nodes(slurm_cluster, shared, dataset, reference):
    job = sbatch_train(slurm_cluster, shared, run_config(shared, dataset, "slurm_dp", train_iters=ITERS))
    state = wait_job(slurm_cluster, job)
    log = job_log(shared, job)
    assert state == "COMPLETED", (state, log[-4000:])
    assert "dp 2" in log, log[-3000:]
    losses = train_losses(shared / "slurm_dp")
    for it in range(1, ITERS + 1):
        assert losses[it] == pytest.approx(reference[it], abs=1e-6), (it, losses[it], reference[it])


def test_usr1_preemption_saves_requeues_and_resumes_exactly(slurm_cluster, shared, dataset, reference):
    cfg = run_config(shared, dataset, "preempted", train_iters=ITERS)
    job = sbatch_train(slurm_cluster, shared, cfg)
    assert wait_job(slurm_cluster, job, states=("RUNNING",), timeout=60) == "RUNNING"

    deadline = time.monotonic() + 180
    while "iteration 12/" not in job_log(shared, job):
        assert time.monotonic() < deadline and job_state(slurm_cluster, job) == "RUNNING", job_log(shared, job)[-3000:]
        time.sleep(0.2)
    slurm_cluster.run(slurm_cluster.hosts[0], ["scancel", "--signal=USR1", "--batch", job])
    sent = time.monotonic()
    while "[signal] received signal SIGUSR1" not in job_log(shared, job):  # the save starts with this line
        assert time.monotonic() - sent < 60, job_log(shared, job)[-3000:]
        time.sleep(0.1)
    delivery_s = time.monotonic() - sent
    assert delivery_s <= SAVE_STARTS_WITHIN_S, (delivery_s, job_log(shared, job)[-3000:])
    state = wait_job(slurm_cluster, job, states=("COMPLETED", "FAILED", "CANCELLED"), timeout=300)
    log = job_log(shared, job)
    assert state == "COMPLETED", (state, log[-5000:])
    assert "batch script: USR1 (pre-emption)" in log and "requeueing job" in log, log[-4000:]
    assert "[signal] received signal SIGUSR1" in log, log[-4000:]
    ck = str(shared / "preempted" / "checkpoints")
    saved = [line for line in log.splitlines() if "deepy.py: stopped by SIGUSR1" in line]
    assert saved and "saved global_step" in saved[0], log[-4000:]
    stopped_at = int(saved[0].split("saved global_step")[1].split()[0])
    assert stopped_at > 12 and f"global_step{stopped_at}" in log.split("requeueing job")[1], log[-4000:]
    assert step_of(read_latest(ck)) == ITERS
    resumed = train_losses(shared / "preempted")
    for it in range(stopped_at + 1, ITERS + 1):
        assert resumed[it] == pytest.approx(reference[it], abs=1e-6), (it, resumed[it], reference[it])


def test_tasks_that_each_see_world_size_one_are_refused(slurm_cluster, shared, dataset):
    cfg = run_config(shared, dataset, "world_one")
    proc = slurm_cluster.run(slurm_cluster.hosts[0], ["srun", "-N", "2", "-n", "2", "--export=ALL,WORLD_SIZE=1,RANK=0",
                                                      os.path.join(ROOT, ".venv", "bin", "python"),
                                                      os.path.join(ROOT, "train.py"), cfg],
                             check=False, cwd=ROOT, env=child_env(), timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "WORLD_SIZE=1 in a Slurm step of 2 tasks" in out, out[-3000:]
    assert "Traceback" not in out
    assert not (shared / "world_one" / "checkpoints").exists()
