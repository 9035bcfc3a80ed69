"""deepy.py removes the shared-memory buffers DeepSpeed's CPU all-reduce leaves in /dev/shm
(megatron/launch/shm_buffers.py): this launch's, found by its master port, and no others."""
import os

from megatron.launch.shm_buffers import PREFIX, launch_buffers, remove_launch_buffers


def test_only_this_launchs_buffers_are_removed(tmp_path):
    uid = os.getuid()
    ours = [f"{PREFIX}_{uid}_127.0.0.1_29500_0", f"{PREFIX}_{uid}_127.0.0.1_29500_1", f"{PREFIX}_{uid}_node_a_29500_3"]
    others = [f"{PREFIX}_{uid}_127.0.0.1_29501_0",  # another launch, another port
              f"{PREFIX}_{uid + 1}_127.0.0.1_29500_0",  # another user
              f"{PREFIX}_{uid}_127.0.0.1_129500_0", f"{PREFIX}_{uid}_127.0.0.1_29500_x", "unrelated_29500_0"]
    for name in ours + others:
        (tmp_path / name).write_bytes(b"x")
    assert [os.path.basename(p) for p in launch_buffers(29500, str(tmp_path))] == sorted(ours)
    assert remove_launch_buffers(29500, str(tmp_path)) == 3
    assert sorted(os.listdir(tmp_path)) == sorted(others)
    assert remove_launch_buffers(29500, str(tmp_path)) == 0  # nothing left: nothing to do
