"""DeepSpeed's CPU all-reduce leaves its shared-memory buffers behind: each rank of a CPU run
creates /dev/shm/deepspeed_allreduce_buffer_<uid>_<master addr>_<master port>_<rank> (66 MB) and
nothing ever unlinks it (deepspeed/ops/csrc/cpu/comm/shm.cpp has a shared_close that is never
called). /dev/shm is memory: a day of test runs on this project's 24 GiB machine left 21 GiB
there and the machine swapped. deepy.py removes this launch's buffers on this node once its
workers have exited; the master port names the launch, so a concurrent run on another port keeps
its own."""
from __future__ import annotations

import glob
import os

SHM_DIR = "/dev/shm"
PREFIX = "deepspeed_allreduce_buffer"


def launch_buffers(port: int, shm_dir: str = SHM_DIR) -> list[str]:
    """This user's DeepSpeed all-reduce buffers of the launch on `port` (any master address)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    head = f"{PREFIX}_{uid}_"
    out = []
    for path in glob.glob(os.path.join(glob.escape(shm_dir), head + "*")):
        fields = os.path.basename(path)[len(head):].rsplit("_", 2)  # addr, port, rank
        if len(fields) == 3 and fields[1] == str(int(port)) and fields[2].isdigit():
            out.append(path)
    return sorted(out)


def remove_launch_buffers(port: int, shm_dir: str = SHM_DIR) -> int:
    """Unlink the launch's buffers (a worker still mapping one keeps its mapping); how many."""
    removed = 0
    for path in launch_buffers(port, shm_dir):
        try:
            os.unlink(path)
            removed += 1
        except OSError:  # gone already, or not ours to remove: nothing to clean
            pass
    return removed
