"""One file per launcher (megatron/launchers/): the config's choices, the ranks each process reads,
and what deepy.py hands the runner or exports for the rendezvous all come from the launcher's file,
so a new launcher is one class (a throwaway one here). The MPI launchers: DeepSpeed's runner starts
the script itself under mpirun, with OMPI_COMM_WORLD_* / MV2_COMM_WORLD_* and no RANK or MASTER_ADDR;
every process trained as a world of one before (auto_mpi_discovery is off)."""
import pytest

from megatron.errors import UserError
from megatron.launch.launcher import runner_args
from megatron.launchers import Launcher, launcher_names, register_launcher
from megatron.launchers import registry as launcher_registry
from megatron.process.distributed import ranks_from_launcher
from megatron.process.ranks import LaunchRanks, claimed_rank, launch_ranks


def test_the_config_offers_every_launcher_file_pdsh_first():
    assert launcher_names() == ("pdsh", "mvapich", "openmpi", "slurm")


@pytest.mark.parametrize("prefix", ["OMPI_COMM_WORLD", "MV2_COMM_WORLD"])
def test_mpi_processes_take_their_ranks_and_the_exported_rendezvous(prefix):
    env = {f"{prefix}_SIZE": "4", f"{prefix}_RANK": "2", f"{prefix}_LOCAL_RANK": "0", "MASTER_ADDR": "h1",
           "MASTER_PORT": "29600"}
    assert launch_ranks(env) == LaunchRanks(2, 4, 0) and claimed_rank(env) == 2
    ranks_from_launcher(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
        ("2", "4", "0", "h1", "29600")
    assert launch_ranks({f"{prefix}_SIZE": "1", f"{prefix}_RANK": "0"}) == LaunchRanks(0, 1, 0)  # mpirun -n 1


@pytest.mark.parametrize("env, said", [
    ({"OMPI_COMM_WORLD_SIZE": "4"}, "OMPI_COMM_WORLD_SIZE=4 but OMPI_COMM_WORLD_RANK=None"),
    ({"MV2_COMM_WORLD_SIZE": "2", "MV2_COMM_WORLD_RANK": "2"}, "MV2_COMM_WORLD_SIZE=2 but MV2_COMM_WORLD_RANK='2'"),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1", "RANK": "0", "WORLD_SIZE": "1"},
     "WORLD_SIZE=1 while openmpi started 4 processes"),
])
def test_contradicting_mpi_variables_are_refused_by_name(env, said):
    with pytest.raises(UserError, match=said):
        launch_ranks(env)


def _two_hosts(tiny_config, tmp_path, launcher):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("h1 slots=1\nh2 slots=1\n")
    return tiny_config(hostfile=str(hostfile), launcher=launcher)


def test_the_runner_gets_each_launchers_rendezvous(tiny_config, tmp_path):
    def launcher_args(name):
        args = runner_args(_two_hosts(tiny_config, tmp_path, name), "train.py", "r.yml", master_addr="h1")
        assert args[args.index("--launcher") + 1] == name
        return args[args.index("--launcher_args") + 1] if "--launcher_args" in args else None

    assert launcher_args("openmpi") == "-x MASTER_ADDR=h1 -x MASTER_PORT=29500"
    assert launcher_args("mvapich") == "-genv MASTER_ADDR h1 -genv MASTER_PORT 29500"
    assert launcher_args("pdsh") is None and launcher_args("slurm") is None  # the runner's / deepy.py's environment
    from megatron.launchers import launcher
    assert launcher("slurm").rendezvous_environment("h1", 29500) == {"MASTER_ADDR": "h1", "MASTER_PORT": "29500"}


@pytest.fixture
def throwaway():
    """A launcher added as docs/architecture.md says: one class, registered; removed afterwards."""
    @register_launcher
    class Throwaway(Launcher):
        name = "throwaway"
        summary = "a test's"
        rank_variable, size_variable, local_variable = "TA_RANK", "TA_SIZE", "TA_LOCAL"

        def runner_arguments(self, master_addr, master_port):
            return ["--launcher_args", f"--at {master_addr}:{master_port}"]

    yield Throwaway
    launcher_registry._LAUNCHERS.pop("throwaway")


def test_a_new_launcher_is_one_class(throwaway, tiny_config, tmp_path):
    assert "throwaway" in launcher_names()
    cfg = _two_hosts(tiny_config, tmp_path, "throwaway")  # the config's choices take it
    args = runner_args(cfg, "train.py", "r.yml", master_addr="h1")
    assert args[args.index("--launcher") + 1] == "throwaway" and "--at h1:29500" in args
    env = {"TA_SIZE": "3", "TA_RANK": "1", "TA_LOCAL": "1"}
    assert launch_ranks(env) == LaunchRanks(1, 3, 1) and claimed_rank(env) == 1
