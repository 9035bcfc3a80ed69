"""Which process of a launch this is: (rank, world size, local rank), read from the environment a
launcher gives each of its processes, in one place for every entry point.

- torch.distributed's variables RANK, WORLD_SIZE, LOCAL_RANK (DeepSpeed's launcher, torchrun) win,
  unless a launcher's own variables contradict them (megatron/launchers/: each launcher's file);
- else a launcher's own variables (srun's task variables, mpirun's OMPI_COMM_WORLD_* / MV2_COMM_WORLD_*:
  the runner starts the script itself there, without torch.distributed's);
- else one process: (0, 1, 0).

Torch-free on purpose: the console reads it before anything heavy is imported.
"""
from __future__ import annotations

import os

from megatron.errors import UserError
from megatron.launchers import Launcher, LaunchRanks, launchers
from megatron.launchers.base import env_int

__all__ = ["LaunchRanks", "claimed_rank", "launch_ranks", "own_launch"]


def own_launch(env=None) -> tuple[Launcher, LaunchRanks] | None:
    """The launcher whose own variables give this process several ranks, and those ranks (None:
    RANK is set, or no launcher's variables describe several processes)."""
    env = os.environ if env is None else env
    if env.get("RANK") is not None:
        return None
    for launcher in launchers().values():
        ranks = launcher.own_ranks(env)
        if ranks is not None:
            return launcher, ranks
    return None


def launch_ranks(env=None) -> LaunchRanks:
    """(rank, world_size, local_rank) of this process; a UserError naming the variables when they
    contradict each other. Several processes that would each run as a world of one (WORLD_SIZE=1
    exported into a Slurm job or an mpirun) are refused: each would do the whole work alone, and
    their outputs would collide."""
    env = os.environ if env is None else env
    if env.get("RANK") is not None:
        world = env_int(env, "WORLD_SIZE", 1)
        if world is None:
            raise UserError("RANK is set but WORLD_SIZE is not: a launcher sets both (with LOCAL_RANK, MASTER_ADDR "
                            "and MASTER_PORT); set WORLD_SIZE too, or unset RANK to run one process")
        rank, local = env_int(env, "RANK", 0), env_int(env, "LOCAL_RANK", 0) or 0
        if rank >= world:
            raise UserError(f"RANK={rank} is not below WORLD_SIZE={world}: ranks are 0..WORLD_SIZE-1")
        for launcher in launchers().values():
            problem = launcher.contradiction(env, world)
            if problem:
                raise UserError(problem)
        return LaunchRanks(rank, world, local)
    found = own_launch(env)
    return found[1] if found else LaunchRanks(0, 1, 0)


def claimed_rank(env=None) -> int:
    """This process's rank as the environment states it, without the checks of launch_ranks (0
    when nothing says): who reports an error that every process of a launch meets alike, such as
    a bad command line or contradicting launch variables, so it is said once."""
    env = os.environ if env is None else env
    names = ["RANK"] + [launcher.rank_variable for launcher in launchers().values() if launcher.rank_variable]
    for name in names:
        text = (env.get(name) or "").strip()
        if text:
            return int(text) if text.isdigit() else 0
    return 0
