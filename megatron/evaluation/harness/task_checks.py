"""Finding and checking harness tasks before the model loads: the local tasks, the user's own
(--include-path DIR, or --tasks FILE.yaml) and the harness's; names with close matches; every
task's YAML, data and templates, so a bad task is one error naming it, not a traceback later."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from megatron.config.errors import close_matches
from megatron.config.untrusted_yaml import check_file
from megatron.errors import UserError
from megatron.evaluation.harness.local_tasks import GROUP, LOCAL_TASKS, write_task_dir


def check_include_paths(paths) -> list[str]:
    """--include-path: directories of the user's own task YAML (lm-eval's --include_path). A YAML
    file goes to --tasks instead, as in lm-eval; checked before anything loads."""
    out = []
    for path in paths or ():
        if os.path.isfile(path) and path.endswith((".yaml", ".yml")):
            raise UserError(f"--include-path {path!r} is a YAML file: pass its directory to --include-path, "
                            f"or the file itself to --tasks (as lm-eval takes it)")
        if not os.path.isdir(path):
            raise UserError(f"--include-path {path!r} is not a directory: pass a directory holding your "
                            "lm-eval task YAML files")
        out.append(os.path.abspath(path))
    return out


def is_yaml_task(name: str) -> bool:
    """A task given as the path of its YAML file (lm-eval's `--tasks path/to/task.yaml`)."""
    return name.endswith((".yaml", ".yml")) and os.path.isfile(name)


def _includes(root, path: str) -> list[str]:
    """The files a task YAML's top-level `include:` names (one path or a list), as lm-eval
    resolves them: relative to the including file."""
    if not isinstance(root, yaml.MappingNode):
        return []
    out = []
    for key, value in root.value:
        if isinstance(key, yaml.ScalarNode) and key.value == "include":
            items = value.value if isinstance(value, yaml.SequenceNode) else [value]
            out += [os.path.join(os.path.dirname(path), i.value) for i in items if isinstance(i, yaml.ScalarNode)]
    return out


def check_task_file_limits(names, include_paths) -> None:
    """The user's task YAML (--tasks FILE.yaml, every *.yaml under --include-path, and what they
    include) within the untrusted-YAML limits, before lm-eval reads any of it: its loader has none
    (a "billion laughs" file would exhaust memory as lm-eval indexes it)."""
    todo = [n for n in names if is_yaml_task(n)]
    for root in include_paths:
        todo += sorted(str(p) for p in Path(root).glob("**/*.yaml"))
    seen = set()
    while todo:
        path = os.path.abspath(todo.pop())
        if path in seen or not os.path.isfile(path):
            continue  # a missing include is lm-eval's to report
        seen.add(path)
        todo += _includes(check_file(path, f"task file {path}"), path)


def task_manager(names: list[str], task_dir: str, include_paths=()):
    """The harness's TaskManager over the local tasks' YAML (written to `task_dir`) and the user's
    --include-path directories. The harness's own ~15k task files are indexed (~5-10 s) only when
    a name is found in neither."""
    from lm_eval.tasks import TaskManager  # lazy: lm-eval (~0.8 s); evaluate.py's --max-length check imports this module

    user = check_include_paths(include_paths)
    check_task_file_limits(names, user)
    paths = [write_task_dir(task_dir), *user]  # later paths win in lm-eval: the user's own tasks
    manager = TaskManager(include_path=paths, include_defaults=False)
    if all(is_yaml_task(n) or manager.match_tasks([n]) for n in names):
        return manager
    return TaskManager(include_path=paths, include_defaults=True)


def unreadable_task_files(paths) -> list[str]:
    """'FILE (reason)' for each YAML file under the user's directories that lm-eval cannot read: it
    leaves them out of its index without a word, and their tasks then look unknown."""
    from lm_eval.tasks._yaml_loader import load_yaml  # lazy: lm-eval, as in task_manager

    out = []
    for root in paths or ():
        for path in sorted(Path(root).glob("**/*.yaml")):
            try:
                load_yaml(path, resolve_func=False, recursive=True)
            except Exception as e:  # noqa: BLE001 - any reason lm-eval's index would skip the file
                out.append(f"{path} ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
    return out


def check_tasks(names: list[str], manager, include_paths=()) -> list[str]:
    """The names, each a task, group or tag the harness knows (glob patterns allowed, as lm_eval's
    CLI) or a task YAML file's path."""
    unknown = [n for n in names if not (is_yaml_task(n) or manager.match_tasks([n]))]
    if unknown:
        hints = []
        for n in unknown:
            close = close_matches(n, manager.all_tasks)
            hints.append(f"{n!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        broken = unreadable_task_files(include_paths)
        broken = f"; lm-eval cannot read these task files in --include-path: {'; '.join(broken)}" if broken else ""
        raise UserError(f"unknown task{'s' if len(unknown) > 1 else ''} {', '.join(hints)}{broken}; the offline "
                        f"local tasks are {', '.join(LOCAL_TASKS)} (group {GROUP}); your own task YAML: "
                        "--include-path DIR (or --tasks FILE.yaml); `lm_eval ls tasks` lists the harness's")
    yaml_files = [os.path.abspath(n) for n in names if is_yaml_task(n)]
    return manager.match_tasks([n for n in names if not is_yaml_task(n)]) + yaml_files


def check_task_docs(manager, names: list[str]) -> None:
    """Load each task (its YAML and data) and render its first document, before the model loads:
    a missing data file, a dataset that cannot be reached or a template naming a field the data
    lacks is one error naming the task, not a traceback after minutes of loading."""
    for name in names:
        try:
            tasks = manager.load([name])["tasks"]
            for task_name, task in tasks.items():
                name = task_name
                doc = next(iter(task.eval_docs), None)
                if doc is None:
                    raise UserError(f"task {name!r} has no documents in its evaluation split; check its data files")
                task.doc_to_text(doc)
                task.doc_to_target(doc)
                if task.OUTPUT_TYPE == "multiple_choice":
                    task.doc_to_choice(doc)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - lm-eval, datasets and jinja raise many types for one cause
            raise _task_error(name, e) from e


def _task_error(name: str, e: Exception) -> UserError:
    import jinja2  # lazy: jinja2 comes with lm-eval; only a failing task needs it

    what = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
    if isinstance(e, (jinja2.TemplateError, KeyError)):  # the task's templates against its data
        return UserError(f"task {name!r}: its first document does not render ({what}); check doc_to_text / "
                         "doc_to_target / doc_to_choice in its YAML against the fields of its data")
    return UserError(f"task {name!r} cannot be loaded ({what}); check its YAML and data files (standard tasks "
                     "need their datasets once: see docs/evaluation.md, 'Standard tasks')")
