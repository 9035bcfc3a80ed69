"""MVAPICH2: DeepSpeed's runner starts the script itself under MVAPICH2's (Hydra) `mpirun`, so each
process has MV2_COMM_WORLD_* and neither torch.distributed's variables nor MASTER_ADDR (as with Open
MPI, openmpi.py). The ranks come from MVAPICH2's variables, and deepy.py exports the rendezvous to
every process with Hydra's `-genv NAME VALUE` through the runner's --launcher_args."""
from .base import Launcher
from .registry import register_launcher


@register_launcher
class Mvapich(Launcher):
    name = "mvapich"
    summary = "mpirun (MVAPICH2): ranks from MV2_COMM_WORLD_*, the rendezvous exported with -genv"
    rank_variable = "MV2_COMM_WORLD_RANK"
    size_variable = "MV2_COMM_WORLD_SIZE"
    local_variable = "MV2_COMM_WORLD_LOCAL_RANK"
    export_option = "-genv {name} {value}"
