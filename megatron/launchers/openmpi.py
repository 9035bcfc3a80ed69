"""Open MPI: DeepSpeed's runner starts the script itself under `mpirun` (no DeepSpeed launcher in
between), so each process has Open MPI's OMPI_COMM_WORLD_* variables and neither torch.distributed's
RANK/WORLD_SIZE nor MASTER_ADDR (DeepSpeed would ask mpi4py, which we switch off: auto_mpi_discovery
False). The ranks come from Open MPI's variables, and deepy.py exports the rendezvous to every process
with mpirun's `-x NAME=VALUE` through the runner's --launcher_args."""
from .base import Launcher
from .registry import register_launcher


@register_launcher
class OpenMPI(Launcher):
    name = "openmpi"
    summary = "mpirun (Open MPI): ranks from OMPI_COMM_WORLD_*, the rendezvous exported with -x"
    rank_variable = "OMPI_COMM_WORLD_RANK"
    size_variable = "OMPI_COMM_WORLD_SIZE"
    local_variable = "OMPI_COMM_WORLD_LOCAL_RANK"
    export_option = "-x {name}={value}"
