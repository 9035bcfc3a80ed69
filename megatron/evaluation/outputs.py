"""Where evaluation results go, for every entry point that writes them (evaluate.py, eval.py):
each checkpoint's results get their own directory (`results_dirs`), never inside a checkpoint
(megatron/outputs_vs_inputs.py), the output directory is proven writable before anything is loaded,
earlier results there are never replaced silently (refused unless --overwrite), and one evaluation
at a time writes into it (a second one into the same directory would leave only one of the two results).
"""
from __future__ import annotations

import contextlib
import os
import tempfile

from megatron.atomic_io import OutputExists
from megatron.errors import UserError
from megatron.evaluation.report import default_output_dir
from megatron.outputs_vs_inputs import refuse_overlap, refuse_shared_outputs
from megatron.process.run_lock import RunLock

LOCK_NAME = "eval.lock"
GENERIC_NAMES = ("checkpoints", "ckpt")  # a run's checkpoint directory: its run directory names it


def _name_parts(ckpt: str) -> list[str]:
    """The path's components that can name its results, innermost last (runs/x/checkpoints -> [.., runs, x])."""
    parts = [p for p in os.path.abspath(ckpt).split(os.sep) if p]
    return parts[:-1] if len(parts) > 1 and parts[-1] in GENERIC_NAMES else parts


def checkpoint_name(ckpt: str) -> str:
    """What names a checkpoint in titles: its run directory for a `checkpoints` directory
    (runs/quickstart/checkpoints -> quickstart), else its own name."""
    return _name_parts(ckpt)[-1]


def results_dirs(checkpoints: list[str], out: str | None) -> dict[str, str]:
    """{checkpoint: its results directory}. One checkpoint: `out` (default <checkpoint>/../eval).
    Several: one subdirectory of `out` (default eval/) each, named by the checkpoint's directory
    (its run's, for a `checkpoints` directory); checkpoints whose names coincide (x/run1 and
    y/run1) take as many parent directories as tell them apart (x_run1, y_run1), so no result
    replaces another's. Refused: the same checkpoint twice, or results inside any checkpoint."""
    if len(checkpoints) == 1:
        dirs = {checkpoints[0]: out or default_output_dir(checkpoints[0])}
    else:
        parts = {c: _name_parts(c) for c in checkpoints}
        depth = dict.fromkeys(checkpoints, 1)
        while True:  # lengthen only the names that still coincide
            names = {c: "_".join(parts[c][-depth[c]:]) for c in checkpoints}
            clash = [c for c in checkpoints if list(names.values()).count(names[c]) > 1 and depth[c] < len(parts[c])]
            if not clash:
                break
            for c in clash:
                depth[c] += 1
        dirs = {c: os.path.join(out or "eval", names[c]) for c in checkpoints}
    refuse_shared_outputs("--out", [(c, dirs[c]) for c in checkpoints])  # a checkpoint given twice too
    for d in dirs.values():
        refuse_overlap("--out", d, [("the checkpoint being evaluated (--checkpoint)", c) for c in checkpoints])
    return dirs


def missing_dirs(path: str) -> list[str]:
    """`path` and its ancestors that do not exist yet, deepest first (what makedirs would create)."""
    created, parent = [], os.path.abspath(path)
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        created.append(parent)
        parent = os.path.dirname(parent)
    return created


def remove_empty(created: list[str]) -> None:
    """rmdir the directories this run created, deepest first, as long as they are empty."""
    for d in created:
        try:
            os.rmdir(d)
        except OSError:
            break


def check_output_dir(path: str) -> None:
    """Prove now that files can be written in `path`: results must never be computed and then lost.
    Directories created for the probe are removed again (a failed run leaves no empty eval/)."""
    created = missing_dirs(path)
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as e:
        raise UserError(f"cannot write results to the output directory {path!r} ({e.strerror or e}); "
                        "pass a writable --out directory (nothing was evaluated)") from e
    finally:
        remove_empty(created)


def refuse_earlier_results(out_dir: str, names: list[str], overwrite: bool) -> None:
    """OutputExists when out_dir holds an earlier evaluation's results. names[0] is the file
    written last, that says "evaluated": without it a killed run left no complete result to keep."""
    found = [n for n in names if os.path.exists(os.path.join(out_dir, n))]
    if found and found[0] == names[0] and not overwrite:
        raise OutputExists(f"--out {out_dir} already holds the results of an earlier evaluation ({', '.join(found)}); "
                           "refusing to replace them: choose another --out (one per checkpoint, window or setting), "
                           "or pass --overwrite to replace them (nothing was evaluated)")


def output_lock(out_dir: str):
    """The output directory's eval.lock (megatron/process/run_lock.py), not yet taken: check_free()
    asks whether an evaluation is writing there now without creating anything. Released, the file
    is deleted: a finished evaluation leaves only its results."""
    return RunLock(out_dir, path=os.path.join(out_dir, LOCK_NAME), what=f"output directory {out_dir!r}",
                   holder="evaluation", fix="wait for it to finish, or give this evaluation its own "
                   "output directory (--out)", remove_on_release=True)


@contextlib.contextmanager
def output_locks(out_dirs: list[str]):
    """Each output directory's eval.lock, held while the evaluation runs and deleted on release. A
    directory this run created and left empty is removed again."""
    created, locks = {}, []
    try:
        for d in out_dirs:
            created[d] = missing_dirs(d)
            locks.append(output_lock(d).acquire())
        yield
    finally:
        for lock in locks:
            lock.release()
        for made in created.values():
            remove_empty(made)  # stops at the first that is not empty
