"""One perplexity sweep spread over the ranks of a launch (DeepSpeed's launcher, torchrun, srun;
megatron/process/ranks.py says which rank this is).

Every rank loads the model; each length's windows are cut into world-size contiguous parts of
nearly equal size (rank r scores part r), and the parts' sums (per-position loss sums, token and
window counts) are gathered and added in rank order, so every rank holds the same totals and the
result is one process's up to the rounding of float64 additions in another order.

Rank 0 alone checks the output directory, holds its lock and writes. Each step where the ranks
could part ways (the checks, loading, each length, the writes) ends in an agreement: a failure on
any rank ends every rank with the first failing rank's message, which rank 0 alone prints (see
quiet_peers), instead of leaving the others waiting in a collective until a timeout.
"""
from __future__ import annotations

import contextlib
import datetime
import io
import os
import sys

import numpy as np

from megatron.device import DeviceError, describe, device_from_flag, process_group_backend, resolve_device
from megatron.errors import OutOfMemory, UserError, expected_message, is_out_of_memory
from megatron.process.ranks import LaunchRanks, claimed_rank

# The ranks of one launch start within seconds of each other; a rank still alone after this long
# was started without the others (a batch script's own process that sees SLURM_NTASKS > 1, a
# wrong --ntasks) and is told so instead of waiting for collectives' 30-minute timeout.
RENDEZVOUS_SECONDS = 300


class PeerFailure(UserError):
    """How a rank ends on another rank's failure: its message, its exit status, and whether it ends
    the whole evaluation (`fatal`: out of memory, a machine error or a bug) or only the checkpoint
    in hand (the next one of several is still evaluated, by every rank alike)."""

    def __init__(self, message: str, exit_code: int, fatal: bool):
        super().__init__(message)
        self.exit_code, self.fatal = exit_code, fatal


def _outcome(e: BaseException, rank: int) -> tuple[str, int, bool]:
    """(message, exit status, fatal) of a failure, as every rank will end on it."""
    found = expected_message(e, (ValueError,))
    if found is None:
        return (f"rank {rank} failed with an unexpected {type(e).__name__}: {e} (a bug: its traceback is in "
                f"rank {rank}'s output)", 1, True)
    fatal = isinstance(e, OutOfMemory) or is_out_of_memory(e) or not isinstance(e, ValueError)
    return found[0], found[1], fatal


class EvalGroup:
    """This rank's share of an evaluation; with one process every method is the plain local step."""

    def __init__(self, ranks: LaunchRanks, started: bool = False):
        self.rank, self.world_size, self.local_rank = ranks
        self.started = started

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @classmethod
    def start(cls, ranks: LaunchRanks, device) -> EvalGroup:
        """Join the launch's process group (gloo for CPU tensors, nccl for CUDA ones) at
        MASTER_ADDR:MASTER_PORT; one process starts none."""
        if ranks.world_size == 1:
            return cls(ranks)
        import torch.distributed as dist  # lazy: torch; evaluate.py imports this module for its --help

        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not addr or not (port or "").isdigit():
            raise UserError(f"rank {ranks.rank} of {ranks.world_size} needs MASTER_ADDR and MASTER_PORT (rank 0's "
                            "host and a free port) to meet the other ranks; DeepSpeed's launcher sets them, under "
                            "srun export them first, e.g. export MASTER_ADDR=$(scontrol show hostnames "
                            "\"$SLURM_JOB_NODELIST\" | head -n 1) MASTER_PORT=29500 (tools/slurm/eval_sweep.sbatch)")
        try:
            store = dist.TCPStore(addr, int(port), ranks.world_size, is_master=ranks.rank == 0,
                                  timeout=datetime.timedelta(seconds=RENDEZVOUS_SECONDS), wait_for_workers=True)
            dist.init_process_group(process_group_backend(device), store=store, rank=ranks.rank,
                                    world_size=ranks.world_size)
        except (RuntimeError, OSError) as e:  # torch's DistNetworkError / DistStoreError (timeouts, a port in use)
            raise UserError(f"rank {ranks.rank} of {ranks.world_size} could not meet the other ranks at "
                            f"{addr}:{port} ({' '.join(str(e).split())[:200]}): start all {ranks.world_size} "
                            "processes together (srun --ntasks, or deepy.py's num-gpus/hostfile), with MASTER_ADDR "
                            "naming rank 0's host and MASTER_PORT a free port there") from None
        return cls(ranks, started=True)

    def close(self) -> None:
        """Leave the group while the interpreter is whole (megatron/process/distributed.py says why)."""
        if self.started:
            from megatron.process.distributed import shutdown_distributed  # lazy: pulls in torch

            shutdown_distributed()
            self.started = False

    def part_of(self, rank: int, n: int) -> range:
        """Rank `rank`'s windows of n: contiguous, sizes differing by at most one."""
        return range(rank * n // self.world_size, (rank + 1) * n // self.world_size)

    def part(self, n: int) -> range:
        return self.part_of(self.rank, n)

    def _settle(self, error: BaseException | None, payload=None) -> list:
        """Every rank's payload (in rank order) once every rank has reached this point; a failure
        anywhere ends every rank alike: the failing rank re-raises its own exception (marked as
        said by rank 0, see quiet_peers), the others a PeerFailure with its message (prefixed with
        its rank unless 0)."""
        import torch.distributed as dist  # lazy: torch; evaluate.py imports this module for its --help

        gathered = [None] * self.world_size
        dist.all_gather_object(gathered, ("failed", _outcome(error, self.rank)) if error is not None
                               else ("ok", payload))
        failed = [(r, v) for r, (state, v) in enumerate(gathered) if state == "failed"]
        if not failed:
            return [v for _, v in gathered]
        first, (message, code, fatal) = failed[0]
        if first == self.rank:
            error.said_by_rank0 = True
            raise error
        raise PeerFailure(message if first == 0 or message.startswith(f"rank {first} ") else f"rank {first}: {message}",
                          code, fatal)

    def agree(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on this rank, its value returned once every rank has run its own
        (nothing is sent but whether it failed)."""
        if not self.started:
            return fn(*args, **kwargs)
        try:
            value = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it; _settle raises it again
            self._settle(e)  # raises, on every rank
            raise
        self._settle(None)
        return value

    def on_rank0(self, fn, *args, **kwargs):
        """fn on rank 0 alone (a check or a write), agreed by all: its value on rank 0, None elsewhere."""
        return self.agree(lambda: fn(*args, **kwargs) if self.is_rank0 else None)

    def sum_parts(self, score, *args, **kwargs) -> tuple[np.ndarray, list[int]]:
        """score(*args, **kwargs) -> (float64 sums over this rank's windows, windows scored), where
        score takes its windows with self.part(n); returns the sums over all ranks, added in rank
        order (so the same on every rank), and each rank's count of windows scored."""
        parts = self.gather(score, *args, **kwargs)
        total = np.zeros_like(np.asarray(parts[0][0], dtype=np.float64))
        for sums, _ in parts:
            total = total + np.asarray(sums, dtype=np.float64)
        return total, [count for _, count in parts]

    def gather(self, work, *args, **kwargs) -> list:
        """work(*args, **kwargs) -> this rank's part of a result (any picklable value); returns every
        rank's part in rank order, on every rank (a failure anywhere ends every rank alike)."""
        try:
            mine = work(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - every rank must learn of it; _settle raises it again
            if not self.started:
                raise
            self._settle(e)  # raises, on every rank
            raise
        return self._settle(None, mine) if self.started else [mine]

    def fail(self, message: str) -> UserError:
        """The error every rank ends on for a failure all of them know of: said by rank 0 alone."""
        return UserError(message) if self.is_rank0 else PeerFailure(message, 2, True)


ONE_PROCESS = EvalGroup(LaunchRanks(0, 1, 0))


def rank_device(flag: str, ranks: LaunchRanks, prog: str):
    """--device for this rank (call it inside EvalGroup.agree: one rank's missing GPU is then said by
    rank 0). With several ranks a GPU run puts rank r on cuda:LOCAL_RANK (the launcher started one
    process per GPU), so a GPU index in the flag is refused."""
    if ranks.world_size == 1:
        return device_from_flag(flag, prog)
    device = resolve_device(flag)
    if device.type == "cuda":
        import torch  # lazy: torch, as in EvalGroup.start

        if ":" in str(flag):
            raise DeviceError(f"--device {flag} with {ranks.world_size} ranks: each rank takes the GPU of its "
                              "LOCAL_RANK; pass --device cuda (or auto)")
        if ranks.local_rank >= torch.cuda.device_count():
            raise DeviceError(f"rank with LOCAL_RANK {ranks.local_rank} needs GPU cuda:{ranks.local_rank}, but torch "
                              f"sees {torch.cuda.device_count()}: start at most {torch.cuda.device_count()} ranks per "
                              "node, or use --device cpu")
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)  # nccl's collectives (and all_gather_object's tensors) use it
    if ranks.rank == 0:
        print(f"{prog}: {ranks.world_size} ranks, rank 0 on {describe(device)}", file=sys.stderr, flush=True)
    return device


@contextlib.contextmanager
def rank0_speaks():
    """Hold back what argparse prints on ranks other than 0: every rank parses the same command
    line, so rank 0's copy of the message is the one to read."""
    if claimed_rank() == 0:
        yield
        return
    with contextlib.redirect_stderr(io.StringIO()):
        yield


def quiet_peers(main, argv=None) -> int:
    """main(argv), where a rank other than 0 ends a failure the group agreed on (EvalGroup.agree)
    with its exit status and no message: rank 0 says it, so the launch's output holds it once. Any
    other failure of this rank is its own to say (a bug keeps its traceback)."""
    if claimed_rank() == 0:
        return main(argv)
    try:
        return main(argv)
    except Exception as e:  # noqa: BLE001 - re-raised unless rank 0 says it
        found = expected_message(e, (ValueError,))
        if found is None or not (isinstance(e, PeerFailure) or getattr(e, "said_by_rank0", False)):
            raise  # this rank's own failure, outside any agreement: its own message (or traceback)
        return found[1]
