"""Which process of a launch this is: (rank, world size, local rank), read from the environment a
launcher gives each of its processes, in one place for every entry point.

- torch.distributed's variables RANK, WORLD_SIZE, LOCAL_RANK (DeepSpeed's launcher, torchrun) win;
- else Slurm's task variables SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID (the tasks of an
  `srun`: only srun sets the step's task count);
- else one process: (0, 1, 0).

Torch-free on purpose: the console reads it before anything heavy is imported.
"""
from __future__ import annotations

import os
from typing import NamedTuple

from megatron.errors import UserError


class LaunchRanks(NamedTuple):
    rank: int
    world_size: int
    local_rank: int


def _int(env, name: str, minimum: int) -> int | None:
    text = env.get(name)
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise UserError(f"the environment variable {name}={text!r} must be an integer >= {minimum}: "
                        "it is set by the launcher (DeepSpeed, torchrun, srun); unset it to run one process")
    return value


def slurm_tasks(env=None) -> int | None:
    """The task count of the srun step this process belongs to (None: not a task of a step). Only
    srun sets SLURM_STEP_NUM_TASKS: the batch script's own shell has SLURM_NTASKS and SLURM_PROCID=0
    too (seen on the test cluster, tests/cluster/), and a `python train.py` there is one process."""
    env = os.environ if env is None else env
    return _int(env, "SLURM_STEP_NUM_TASKS", 1)


def launch_ranks(env=None) -> LaunchRanks:
    """(rank, world_size, local_rank) of this process; a UserError naming the variables when they
    contradict each other. Several srun tasks that would each run as a world of one (WORLD_SIZE=1
    exported into the job) are refused: each would do the whole work alone, and their outputs
    would collide."""
    env = os.environ if env is None else env
    tasks = slurm_tasks(env)
    if env.get("RANK") is not None:
        world = _int(env, "WORLD_SIZE", 1)
        if world is None:
            raise UserError("RANK is set but WORLD_SIZE is not: a launcher sets both (with LOCAL_RANK, MASTER_ADDR "
                            "and MASTER_PORT); set WORLD_SIZE too, or unset RANK to run one process")
        rank, local = _int(env, "RANK", 0), _int(env, "LOCAL_RANK", 0) or 0
        if rank >= world:
            raise UserError(f"RANK={rank} is not below WORLD_SIZE={world}: ranks are 0..WORLD_SIZE-1")
        if world == 1 and tasks and tasks > 1:
            raise UserError(f"WORLD_SIZE=1 in a Slurm step of {tasks} tasks (SLURM_STEP_NUM_TASKS={tasks}): each task would "
                            "run alone, as a world of one, and repeat the others' work. Unset RANK and WORLD_SIZE "
                            "in the job script (each task's rank then comes from SLURM_PROCID), or run one task "
                            "(srun --ntasks 1)")
        return LaunchRanks(rank, world, local)
    if tasks and tasks > 1 and env.get("SLURM_PROCID") is None:  # srun sets both: these are partial
        raise UserError(f"SLURM_STEP_NUM_TASKS={tasks} but SLURM_PROCID is not set: Slurm's task variables are "
                        "partial (copied into the environment by hand?), so this process cannot know its rank and "
                        "would train as a world of one. Start the tasks with srun (it sets both), or unset "
                        "SLURM_STEP_NUM_TASKS to run one process")
    if tasks and tasks > 1:
        rank = _int(env, "SLURM_PROCID", 0)
        if rank >= tasks:
            raise UserError(f"SLURM_PROCID={rank} is not below the step's {tasks} tasks: check srun's --ntasks")
        return LaunchRanks(rank, tasks, _int(env, "SLURM_LOCALID", 0) or 0)
    return LaunchRanks(0, 1, 0)


def claimed_rank(env=None) -> int:
    """This process's rank as the environment states it, without the checks of launch_ranks (0
    when nothing says): who reports an error that every process of a launch meets alike, such as
    a bad command line or contradicting launch variables, so it is said once."""
    env = os.environ if env is None else env
    for name in ("RANK", "SLURM_PROCID"):
        text = (env.get(name) or "").strip()
        if text:
            return int(text) if text.isdigit() else 0
    return 0
