"""A process that set up torch.distributed tears the process group down before interpreter exit:
left to teardown, gloo's threads can abort a rank that finished its work (SIGABRT, "terminate
called without an active exception"), and the launcher then fails the whole run."""
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import atexit, torch
    # registered first, so it runs last (atexit is LIFO): after init_distributed's own handler
    atexit.register(lambda: print("at exit initialized:", torch.distributed.is_initialized(), flush=True))
    from megatron.process.distributed import init_distributed
    info = init_distributed("cpu")
    print("world", info.world_size, flush=True)
""")
LAUNCHER_ENV = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}


def test_process_group_is_destroyed_before_interpreter_exit():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world 1" in proc.stdout
    assert "at exit initialized: False" in proc.stdout, proc.stdout
