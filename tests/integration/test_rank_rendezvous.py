"""Ranks that never meet (issue 54 item 3): one task of two whose partner never starts ended after a
43-line traceback (torch's DistStoreError "1/2 clients joined"); now one line that says how many ranks
joined, where they were to meet and what to check."""
import os
import subprocess
import sys

from megatron.process.distributed import free_port
from tests.conftest import ROOT, train_config_dict, write_token_dataset, write_yaml
from tests.integration.fault_helpers import child_env


def test_a_rank_whose_partner_never_starts_ends_in_one_line(tmp_path):
    data = write_token_dataset(str(tmp_path / "tiny_text_document"))
    cfg = write_yaml(tmp_path / "c.yml", train_config_dict(tmp_path, data, train_iters=2,
                                                           distributed_timeout_minutes=0.05))
    port = free_port()
    env = {**child_env(), "RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port)}
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), cfg], env=env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=180)
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in said, said[-3000:]
    assert f"rank 0 of 2: the process group did not form within distributed-timeout-minutes (0.05): 1 of 2 ranks " \
           f"joined at the rendezvous 127.0.0.1:{port}" in proc.stderr, said[-3000:]
    assert len(proc.stderr.strip().splitlines()) <= 30
    assert not os.path.exists(tmp_path / "run")  # nothing written: the group is formed before anything else
