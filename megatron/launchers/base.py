"""What a launcher says about itself: its name (the config's `launcher` value, which deepy.py hands
DeepSpeed's runner as `--launcher`), and, for a launcher whose processes learn their rank from its
own variables rather than torch.distributed's RANK/WORLD_SIZE/LOCAL_RANK (Slurm's srun), how to
read them, what contradicts them, where the rendezvous is, and what deepy.py exports for it."""
from __future__ import annotations

from typing import NamedTuple

from megatron.errors import UserError


class LaunchRanks(NamedTuple):
    rank: int
    world_size: int
    local_rank: int


def env_int(env, name: str, minimum: int) -> int | None:
    """The integer a launcher's variable holds (None: unset or empty); a UserError naming it otherwise."""
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


class Launcher:
    """A launcher DeepSpeed's runner drives (pdsh, openmpi, mvapich) gives every process
    torch.distributed's variables and needs nothing more; override what yours adds."""

    name: str = ""  # the config's `launcher` value and the runner's `--launcher`
    summary: str = ""  # one line for the config's docs
    # This launcher's own variables for (rank, world size, local rank), for processes it starts
    # without torch.distributed's (None: it sets RANK, WORLD_SIZE and LOCAL_RANK itself)
    rank_variable: str | None = None
    size_variable: str | None = None
    local_variable: str | None = None

    def own_ranks(self, env) -> LaunchRanks | None:
        """(rank, world size, local rank) from this launcher's own variables, when RANK is not set;
        None when they do not describe several processes."""
        if self.size_variable is None:
            return None
        size = env_int(env, self.size_variable, 1)
        if not size or size == 1:
            return None
        rank = env_int(env, self.rank_variable, 0)
        if rank is None or rank >= size:
            raise UserError(f"{self.size_variable}={size} but {self.rank_variable}={env.get(self.rank_variable)!r}: "
                            f"{self.name}'s variables are partial or contradict each other, so this process cannot know "
                            f"its rank; start it with the launcher (it sets both), or unset {self.size_variable}")
        return LaunchRanks(rank, size, env_int(env, self.local_variable, 0) or 0)

    def contradiction(self, env, world_size: int) -> str | None:
        """What in this launcher's variables contradicts RANK/WORLD_SIZE (world_size), or None."""
        own = self.own_ranks(env)
        if own is None or world_size != 1:
            return None
        return (f"WORLD_SIZE=1 while {self.name} started {own.world_size} processes ({self.size_variable}="
                f"{own.world_size}): each would run alone and repeat the others' work. Unset RANK and WORLD_SIZE "
                f"(each process's rank then comes from {self.rank_variable}), or start one process")

    def first_host(self, env) -> str | None:
        """The rendezvous host for processes that learned their rank from own_ranks, when
        MASTER_ADDR is not set (None: 127.0.0.1)."""
        return None

    def rendezvous_environment(self, master_addr: str, master_port: int) -> dict[str, str]:
        """What deepy.py exports into its own environment before a launch across hosts, for
        processes that inherit it (srun's)."""
        return {}

    # mpirun's option exporting one variable to every process, as a format of `name` and `value`
    # (Open MPI's `-x`, Hydra's `-genv`), for launchers whose processes the runner starts itself
    export_option: str | None = None

    def runner_arguments(self, master_addr: str, master_port: int) -> list[str]:
        """DeepSpeed runner options a launch across hosts adds, for processes that learn the
        rendezvous from neither the runner nor deepy.py's environment: mpirun's export of
        MASTER_ADDR and MASTER_PORT through the runner's --launcher_args."""
        if self.export_option is None:
            return []
        exports = (self.export_option.format(name=n, value=v)
                   for n, v in (("MASTER_ADDR", master_addr), ("MASTER_PORT", master_port)))
        return ["--launcher_args", " ".join(exports)]
