# ruff: noqa: E501 - the launchers' lines, verbatim
"""deepy.py's pieces of a launch across hosts that need no hosts: the hostfile's slots decide the
process count, Slurm's task variables give the ranks, the remote launcher's output is relayed
without its noise and ends with the lost host's line. On real hosts: tests/cluster/."""
import io

import pytest

from megatron.errors import UserError
from megatron.launch.hosts import check_slots, ssh_keepalive
from megatron.launch.output import OutputRelay
from megatron.process.distributed import ranks_from_launcher


def hostfile(tmp_path, text: str) -> str:
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_the_hostfiles_slots_decide_and_a_disagreeing_num_gpus_is_refused(tmp_path):
    hf = hostfile(tmp_path, "h1 slots=1\nh2 slots=1\n")
    check_slots(hf, None, None, None, None)  # slots alone: fine
    check_slots(hf, None, None, 1, 2)  # agreeing: fine
    with pytest.raises(UserError, match=r"num-gpus: 8 disagrees with the hostfile .* \(h1 slots=1, h2 slots=1\)"):
        check_slots(hf, None, None, 8, None)
    with pytest.raises(UserError, match=r"num-nodes: 3 but the hostfile .* has 2 usable host"):
        check_slots(hf, None, None, None, 3)
    check_slots(hf, "h1", None, None, 1)  # include narrows the hosts


def test_degenerate_host_sets_are_refused_where_the_slots_are_read(tmp_path):
    """Issue 54 item 1: a host with slots=0, and include/exclude that leave no host, passed the dry run
    ("0 host(s), 0 processes") and ended in a traceback inside DeepSpeed's runner."""
    zero = tmp_path / "zero"
    zero.write_text("h1 slots=2\nh2 slots=0\n")
    with pytest.raises(UserError, match="host h2 would run no process"):
        check_slots(str(zero), None, None, None, None)
    two = tmp_path / "two"
    two.write_text("h1 slots=1\nh2 slots=1\n")
    with pytest.raises(UserError, match=r"exclude: h1@h2 leave no host of the hostfile .* \(its hosts: h1, h2\)"):
        check_slots(str(two), None, "h1@h2", None, None)
    with pytest.raises(UserError, match="Hostname 'h3' not found in hostfile"):
        check_slots(str(two), "h3", None, None, None)  # include naming no listed host: the runner's own words
    check_slots(str(two), None, "h2", None, None)  # one host left: fine


def test_ssh_keepalive_ends_a_dead_connection_within_a_quarter_of_the_timeout():
    options = ssh_keepalive(60)
    assert "ServerAliveInterval=5" in options and "ServerAliveCountMax=3" in options and "BatchMode=yes" in options
    assert "ServerAliveInterval=1" in ssh_keepalive(3)


def test_ranks_from_slurms_task_variables():
    env = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "MASTER_ADDR": "node1"}
    ranks_from_launcher(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"]) == ("3", "4", "1", "29500")
    batch_shell = {"SLURM_NTASKS": "4", "SLURM_PROCID": "0"}  # the batch script itself: no step, one process
    ranks_from_launcher(batch_shell)
    assert "RANK" not in batch_shell
    launched = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    ranks_from_launcher(launched)  # a launcher's own variables agree: kept
    assert launched["RANK"] == "1"
    with pytest.raises(UserError, match=r"WORLD_SIZE=1 in a Slurm step of 2 tasks"):
        ranks_from_launcher({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "1", "RANK": "0", "WORLD_SIZE": "1"})


PDSH_OUTPUT = """\
h1: [2026-11-28 02:08:14,654] [WARNING] [real_accelerator.py:213:get_accelerator] Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.
h1: [2026-11-28 02:08:14,887] [INFO] [launch.py:152:main] WORLD INFO DICT: {'h1': [0], 'h2': [0]}
h2: [2026-11-28 02:08:14,891] [INFO] [launch.py:245:main] process 3835 spawned with command: ['python', 'train.py']
h2: [W1128 02:08:16.220061601 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3
h1: iteration 1/6 | lm_loss: 4.8804E+00
h1: [W1128 02:11:43.662766334 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=15): Failed to recv
h1: Exception raised from recvBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:787 (most recent call first):
h1: frame #0: c10::Error::Error(c10::SourceLocation) + 0x9d (0x7f9b542f8b8d in libc10.so)
h1: <omitting python frames>
h1: [run stopped] lost host h2 (rank 1: no heartbeat for 60 s: it crashed or dropped off the network); ck/latest names global_step4: run the same command again to resume from it
h1: [2026-11-28 02:15:16,543] [INFO] [launch.py:253:sigkill_handler] Killing subprocess 4705
h1: [2026-11-28 02:15:16,543] [ERROR] [launch.py:259:sigkill_handler] ['python', 'train.py'] exits with return code = 75
pdsh@h1: h2: ssh exited with exit code 255
pdsh@h1: h1: ssh exited with exit code 75
"""


def relay(text: str, keep_all: bool = False) -> tuple[str, OutputRelay]:
    out = io.StringIO()
    r = OutputRelay(io.StringIO(text), keep_all=keep_all, out=out).start()
    r.join()
    return out.getvalue(), r


def test_the_relay_drops_the_remote_launchers_noise_and_ends_with_the_lost_host():
    shown, r = relay(PDSH_OUTPUT)
    assert shown == "h1: iteration 1/6 | lm_loss: 4.8804E+00\n"
    assert r.last_words() == ["deepy.py: the run stopped: lost host h2 (rank 1: no heartbeat for 60 s: it crashed or "
                              "dropped off the network); ck/latest names global_step4: run the same command again to "
                              "resume from it"]


def test_without_a_verdict_the_launchers_exit_lines_end_the_output():
    text = "\n".join(line for line in PDSH_OUTPUT.splitlines() if "[run stopped]" not in line) + "\n"
    _, r = relay(text)
    assert r.last_words() == [
        "h1: [2026-11-28 02:15:16,543] [ERROR] [launch.py:259:sigkill_handler] ['python', 'train.py'] exits with "
        "return code = 75", "pdsh@h1: h2: ssh exited with exit code 255", "pdsh@h1: h1: ssh exited with exit code 75"]


def test_debug_keeps_every_line():
    shown, r = relay(PDSH_OUTPUT, keep_all=True)
    assert shown == PDSH_OUTPUT and r.verdict.startswith("lost host h2")


def test_distributed_timeout_minutes_reaches_the_process_group(tmp_path):
    """The config key every host reads from the resolved config sets gloo's collective timeout."""
    import subprocess
    import sys

    from tests.conftest import ROOT
    from tests.integration.fault_helpers import child_env

    code = (f"import sys, torch; sys.path.insert(0, {ROOT!r})\n"
            "from megatron.process.distributed import init_distributed\n"
            "init_distributed('cpu', 'gloo', 0.5)\n"
            "import torch.distributed as d\n"
            "print(d.group.WORLD._get_backend(torch.device('cpu')).options._timeout)")
    out = subprocess.run([sys.executable, "-c", code], env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().endswith("0:00:30"), out.stdout + out.stderr
