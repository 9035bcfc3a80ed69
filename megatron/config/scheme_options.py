"""The positional schemes' own options (megatron/positional/options.py), read from the scheme files
without importing them.

A scheme module imports torch, and importing the config must not: CLI mistakes are answered
before torch loads (~1 s warm, 8-13 s cold; tests/integration/test_cli_fast_answers.py). The
declarations are literals (`options = (Option("xpos_scale_base", float, 512.0, "...", gt=0), ...)`,
module-level names holding them, tuples of them imported from a sibling file, a base class's), so
they are evaluated here from each file's syntax tree: literals, the type names, `int | None`, and
names bound in the package's files; anything else is refused with its file and line.
tests/unit/test_scheme_options.py holds what is read here equal to the imported classes' own.

Why this second reader stays beside the registry (megatron/positional/registry.py), although
ModelConfig.check() imports the schemes anyway for their `option_problems`: that import comes
after the keys are known. The keys and their types must exist before a config can be parsed
at all (a misspelt key, a value of the wrong type, an unknown pos-emb are refused there, before
torch loads); the rules between a scheme's options need the scheme's code, so only a config that
passed the first stage pays for the import.
"""
from __future__ import annotations

import ast
import os

import megatron.positional as positional_package
from megatron.positional import options as options_module
from megatron.positional.options import Option, declared_options

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}
# (path, mtime, size) -> its syntax tree: every config load reads pos-emb's choices, and parsing the
# package's files each time made loading a config ~10x slower; an edited or added file is read again
_PARSED: dict[tuple[str, int, int], ast.Module] = {}


def parse_file(path: str) -> ast.Module:
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _PARSED:
        with open(path, encoding="utf-8") as f:
            _PARSED[key] = ast.parse(f.read(), filename=path)
    return _PARSED[key]


class _Files:
    """The package's files, parsed once each: what a module binds at its top level."""

    def __init__(self, dirs: list[str]):
        self.dirs = dirs
        self.trees: dict[str, ast.Module] = {}

    def module_names(self) -> list[str]:
        names = {f[:-3] for d in self.dirs if os.path.isdir(d) for f in os.listdir(d)
                 if f.endswith(".py") and not f.startswith("_")}
        return sorted(names)

    def path(self, module: str) -> str:
        for d in self.dirs:
            candidate = os.path.join(d, f"{module}.py")
            if os.path.isfile(candidate):
                return candidate
        raise ValueError(f"megatron/positional has no module {module!r}")

    def tree(self, module: str) -> ast.Module:
        if module not in self.trees:
            self.trees[module] = parse_file(self.path(module))
        return self.trees[module]

    def binding(self, module: str, name: str):
        """(module, node) of what `name` is at the top of `module`: an assignment's value, a class,
        or, for a relative import, the binding in the imported file."""
        for node in self.tree(module).body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return module, node.value
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
                return module, node.value
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        if node.module == "options":  # the declaration type itself
                            return None, getattr(options_module, alias.name)
                        return self.binding(node.module, alias.name)
        raise self.refusal(module, None, f"{name!r} is not bound at the top of the file")

    def refusal(self, module: str, node, what: str) -> ValueError:
        where = f"{self.path(module)}:{node.lineno}" if node is not None and hasattr(node, "lineno") \
            else self.path(module)
        return ValueError(f"{where}: {what}; a positional scheme's options must be literal declarations "
                          "(Option(\"key\", float, 0.5, \"doc\", gt=0)), so the config can read them without "
                          "importing the scheme (megatron/config/scheme_options.py)")

    def value(self, module: str, node):
        """The value of an expression in `module`, evaluated from literals and top-level names."""
        if not isinstance(node, ast.AST):
            return node  # already a value (the Option class)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List)):
            out = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    out.extend(self.value(module, element.value))
                else:
                    out.append(self.value(module, element))
            return tuple(out)
        if isinstance(node, ast.Name):
            if node.id in _TYPES:
                return _TYPES[node.id]
            where, bound = self.binding(module, node.id)
            return bound if where is None else self.value(where, bound)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # int | None
            return self.value(module, node.left) | self.value(module, node.right)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and self.value(module, node.func) is Option:
            args = [self.value(module, a) for a in node.args]
            kwargs = {k.arg: self.value(module, k.value) for k in node.keywords if k.arg}
            return Option(*args, **kwargs)
        raise self.refusal(module, node, f"cannot read {ast.unparse(node)!r} without running the file")

    def class_options(self, module: str, cls: ast.ClassDef) -> tuple[Option, ...]:
        """A class's `options`: its own assignment, else its first base's that has one."""
        for node in cls.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
                node.target if isinstance(node, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and target.id == "options" and node.value is not None:
                return self.value(module, node.value)
        for base in cls.bases:
            if isinstance(base, ast.Name):
                where, bound = self.binding(module, base.id)
                if isinstance(bound, ast.ClassDef):
                    return self.class_options(where, bound)
        return ()


def decorator_calls(cls: ast.ClassDef, decorator: str) -> list[ast.Call]:
    """A class's decorators that call `decorator` (@register(...), @register_backend(...))."""
    return [deco for deco in cls.decorator_list if isinstance(deco, ast.Call)
            and isinstance(deco.func, ast.Name) and deco.func.id == decorator]


def registered_names(cls: ast.ClassDef) -> list[str]:
    """The names a class's @register("a", "b") decorator gives it."""
    return [arg.value for deco in decorator_calls(cls, "register")
            for arg in deco.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]


def _options_by_scheme(dirs: list[str] | None) -> dict[str, tuple[Option, ...]]:
    files = _Files(list(positional_package.__path__) if dirs is None else dirs)
    by_scheme = {}
    for module in files.module_names():
        for node in files.tree(module).body:
            if isinstance(node, ast.ClassDef):
                for name in registered_names(node):
                    by_scheme[name] = files.class_options(module, node)
    return by_scheme


def scheme_names(dirs: list[str] | None = None) -> list[str]:
    """Every name a scheme file registers, sorted: registry.scheme_names() without importing the
    schemes (pos-emb's choices, judged before torch loads)."""
    return sorted(_options_by_scheme(dirs))


def scheme_options(dirs: list[str] | None = None) -> dict[str, tuple[Option, list[str]]]:
    """{key: (option, the schemes declaring it)} over every scheme file of megatron/positional
    (its package path: `dirs`), as registry.scheme_options() gives after importing them all."""
    return declared_options(_options_by_scheme(dirs))
