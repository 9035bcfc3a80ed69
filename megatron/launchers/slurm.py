"""Slurm: DeepSpeed's runner starts the script as the tasks of one `srun` step, which inherit
deepy.py's environment; each task learns its rank from Slurm's task variables, SLURM_PROCID,
SLURM_STEP_NUM_TASKS and SLURM_LOCALID (only srun sets the step's task count: the batch script's
own shell has SLURM_NTASKS and SLURM_PROCID=0 too, seen on the test cluster, tests/cluster/, and a
`python train.py` there is one process). The rendezvous is deepy.py's MASTER_ADDR/MASTER_PORT, else
the step's first node."""
from __future__ import annotations

import subprocess

from megatron.errors import UserError

from .base import Launcher, LaunchRanks, env_int
from .registry import register_launcher


@register_launcher
class Slurm(Launcher):
    name = "slurm"
    summary = "srun: ranks from Slurm's task variables, the rendezvous from deepy.py's environment"
    rank_variable = "SLURM_PROCID"
    size_variable = "SLURM_STEP_NUM_TASKS"
    local_variable = "SLURM_LOCALID"

    def own_ranks(self, env) -> LaunchRanks | None:
        tasks = env_int(env, self.size_variable, 1)
        if tasks and tasks > 1 and env.get(self.rank_variable) is None:  # srun sets both: these are partial
            raise UserError(f"SLURM_STEP_NUM_TASKS={tasks} but SLURM_PROCID is not set: Slurm's task variables are "
                            "partial (copied into the environment by hand?), so this process cannot know its rank and "
                            "would train as a world of one. Start the tasks with srun (it sets both), or unset "
                            "SLURM_STEP_NUM_TASKS to run one process")
        if not tasks or tasks == 1:
            return None
        rank = env_int(env, self.rank_variable, 0)
        if rank >= tasks:
            raise UserError(f"SLURM_PROCID={rank} is not below the step's {tasks} tasks: check srun's --ntasks")
        return LaunchRanks(rank, tasks, env_int(env, self.local_variable, 0) or 0)

    def contradiction(self, env, world_size: int) -> str | None:
        tasks = env_int(env, self.size_variable, 1)
        if world_size != 1 or not tasks or tasks <= 1:
            return None
        return (f"WORLD_SIZE=1 in a Slurm step of {tasks} tasks (SLURM_STEP_NUM_TASKS={tasks}): each task would "
                "run alone, as a world of one, and repeat the others' work. Unset RANK and WORLD_SIZE "
                "in the job script (each task's rank then comes from SLURM_PROCID), or run one task "
                "(srun --ntasks 1)")

    def first_host(self, env) -> str | None:
        try:
            nodes = subprocess.run(["scontrol", "show", "hostnames", env.get("SLURM_STEP_NODELIST", "")],
                                   capture_output=True, text=True, check=False).stdout.split()
        except OSError:  # no scontrol on this host: the caller falls back to this machine
            return None
        return nodes[0] if nodes else None

    def rendezvous_environment(self, master_addr: str, master_port: int) -> dict[str, str]:
        return {"MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}
