"""Training across two hosts through Open MPI (`launcher: openmpi`): DeepSpeed's runner starts the
script itself under mpirun, each process with OMPI_COMM_WORLD_* and neither RANK nor MASTER_ADDR
(megatron/launchers/openmpi.py gives it its rank, and deepy.py exports the rendezvous with mpirun's
-x). Before, each process trained alone as a world of one and the second found the run locked."""
from tests.cluster.conftest import TRAIN_ITERS, deepy, hostfile, run_config
from tests.integration.fault_helpers import child_env, train_losses

# mpirun refuses root unless told (the test cluster's user is root; a real cluster's is not)
AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def test_openmpi_trains_data_parallel_over_two_hosts(cluster, shared, dataset):
    two_hosts = hostfile(shared, "h1 slots=1", "h2 slots=1")
    launch = deepy(cluster, cluster.hosts[0], "train.py",
                   run_config(shared, dataset, "openmpi", launcher="openmpi", hostfile=two_hosts),
                   env={**child_env(), **AS_ROOT})
    rc, _ = launch.finish()
    assert rc == 0, launch.output[-4000:]
    assert "dp 2" in launch.output and "--launcher openmpi" in launch.output, launch.output[-3000:]
    local = deepy(cluster, cluster.hosts[0], "train.py", run_config(shared, dataset, "openmpi_one_host", num_gpus=2))
    rc, _ = local.finish()
    assert rc == 0, local.output[-4000:]
    over_mpi, one_host = train_losses(shared / "openmpi"), train_losses(shared / "openmpi_one_host")
    assert sorted(over_mpi) == list(range(1, TRAIN_ITERS + 1))
    for it in range(1, TRAIN_ITERS + 1):
        assert abs(over_mpi[it] - one_host[it]) <= 1e-6, (it, over_mpi[it], one_host[it])
