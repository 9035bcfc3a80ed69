"""No import circles among our modules.

A circle means no member can be read (or imported) on its own: every one of them needs all the
others first. Imports inside functions count too: a lazy import only hides the circle from Python,
not from the reader.

The walker parses each file with `ast` (nothing is imported), resolves `import a.b`,
`from a import b` (b a submodule or a name) and relative imports to modules inside the package,
and reports every strongly connected component of more than one module, printed as one path
through it plus its members. A package's `__init__` counts as a module (`from megatron.x import y`
runs megatron/x/__init__.py), except as a dependency of its own submodules.
"""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ours that `module` imports anywhere in its file (top level or lazily)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found = set()

    def add(name: str):
        # `import a.b.c` runs a, a.b and a.b.c; each that is ours is a dependency. The package
        # `__init__` of the importer's own parents is not counted (Python runs it before the
        # module, but that is the parent's dependency, not a design edge).
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            cand = ".".join(parts[:i])
            if cand in modules and cand != module and not module.startswith(cand + "."):
                found.add(cand)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            target = (_resolve_relative(module, is_package, node.level, node.module)
                      if node.level else node.module)
            if not target:
                continue
            add(target)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules:
                    add(sub)
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    modules = module_files(root, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with a circle (its members, sorted)."""
    index, low, stack, on_stack, comps = {}, {}, [], set(), []
    counter = [0]

    def strongconnect(v):  # Tarjan's algorithm (recursion depth is fine for ~300 modules)
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(comps)


def cycle_path(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """One closed walk through the component, from its first member back to it (shortest)."""
    start = min(comp)
    # breadth-first from start, staying inside the component, until an edge returns to start
    prev, frontier, seen = {start: None}, [start], {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w in comp and w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def _describe(cycles: list[list[str]], graph) -> str:
    lines = []
    for members in cycles:
        path = cycle_path(graph, set(members))
        lines.append(" -> ".join(path) + f"   (circle of {len(members)}: {', '.join(members)})")
    return "\n".join(lines)


def test_no_import_cycles_under_megatron():
    graph = import_graph(REPO, "megatron")
    assert len(graph) > 50, "the walker found too few modules: is REPO right?"
    cycles = find_cycles(graph)
    assert not cycles, "import circles among megatron modules:\n" + _describe(cycles, graph)


def test_walker_finds_a_cycle_in_a_synthetic_package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    # a -> sub.b (absolute, top level); sub.b -> sub.c (relative); sub.c -> a (lazy, in a function)
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from . import c\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    import pkg.a\n    return pkg.a\n")
    (pkg / "leaf.py").write_text("import os\nfrom pkg.sub.b import nothing\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.sub.c"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    cycles = find_cycles(graph)
    assert cycles == [["pkg.a", "pkg.sub.b", "pkg.sub.c"]]
    assert cycle_path(graph, set(cycles[0])) == ["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]
    assert "pkg.a -> pkg.sub.b -> pkg.sub.c -> pkg.a" in _describe(cycles, graph)
    # and a two-module circle through `from ..x import y` (name, not submodule)
    (pkg / "sub" / "c.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("from ..a import thing\n")
    cycles = find_cycles(import_graph(tmp_path, "pkg"))
    assert cycles == [["pkg.a", "pkg.sub.b"]]


def folder_of(module: str) -> str | None:
    """The first-level room that holds `module`: its folder (megatron.model.gpt -> model), or for a
    module directly in the package the module itself (megatron.console -> console): a top-level file
    is a room of its own in the bottom-up order of docs/architecture.md. None for the package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def mutual_folders(graph: dict[str, set[str]], package: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(room a, room b), a < b: (one import a -> b, one import b -> a)} for every pair of
    first-level folders or top-level modules that import each other (top level or inside functions)."""
    edges: dict[tuple[str, str], str] = {}
    for module, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = folder_of(module), folder_of(dep)
            if a and b and a != b:
                edges.setdefault((a, b), f"{module} imports {dep}")
    return {(a, b): (edges[(a, b)], edges[(b, a)]) for a, b in edges if a < b and (b, a) in edges}


# Pairs of folders that still import each other, each to be cut (then deleted here): the test
# fails on a new pair, and on a listed pair that no longer exists.
STILL_MUTUAL: set = set()  # console.py <-> training/ was the last: the op cache is process/op_cache.py now


def test_no_folder_imports_a_folder_that_imports_it_back():
    """A folder importing a folder that imports it back has no place in the bottom-up order of
    docs/architecture.md: neither can be read (or tested) without the other."""
    pairs = mutual_folders(import_graph(REPO, "megatron"), "megatron")
    new = {p: why for p, why in pairs.items() if p not in STILL_MUTUAL}
    assert not new, "folders under megatron/ importing each other:\n" + "\n".join(
        f"{a} <-> {b}: {ab}; {ba}" for (a, b), (ab, ba) in sorted(new.items()))
    gone = STILL_MUTUAL - set(pairs)
    assert not gone, f"no longer importing each other (delete them from STILL_MUTUAL): {sorted(gone)}"


def test_folder_pairs_count_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in ("low", "high", "other"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "leaf.py").write_text("import os\n")
    (pkg / "high" / "user.py").write_text("from pkg.low import base\nfrom pkg import leaf\n")
    (pkg / "low" / "base.py").write_text("x = 1\n")
    (pkg / "other" / "o.py").write_text("from ..low import base\n")  # one way only: fine
    graph = import_graph(tmp_path, "pkg")
    assert mutual_folders(graph, "pkg") == {}
    # a lazy import back, inside a function, closes the pair
    (pkg / "low" / "base.py").write_text("def f():\n    from ..high.user import g\n    return g\n")
    pairs = mutual_folders(import_graph(tmp_path, "pkg"), "pkg")
    assert pairs == {("high", "low"): ("pkg.high.user imports pkg.low", "pkg.low.base imports pkg.high")}
    # a module directly in the package is a room of its own: leaf.py importing high/ back is a pair
    (pkg / "low" / "base.py").write_text("x = 1\n")
    (pkg / "leaf.py").write_text("from pkg.high import user\n")
    pairs = mutual_folders(import_graph(tmp_path, "pkg"), "pkg")
    assert pairs == {("high", "leaf"): ("pkg.high.user imports pkg.leaf", "pkg.leaf imports pkg.high")}


def test_the_model_imports_no_deepspeed_and_no_parallelism():
    """model/ builds plain modules for one rank; tensor parallelism and the pipeline split (DeepSpeed's
    PipelineModule) are applied from outside, in parallel/ (issue 57)."""
    found = []
    for path in sorted((REPO / "megatron" / "model").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(REPO)}: {n}" for n in names
                      if n.split(".")[0] == "deepspeed" or n.startswith("megatron.parallel")]
    assert not found, "model/ imports DeepSpeed or parallel/:\n" + "\n".join(found)


def test_tokenizers_do_not_reach_into_the_corpus_builders():
    # both download registry packages; the downloader lives below both (megatron/fetch.py)
    graph = import_graph(REPO, "megatron")
    reach = {(m, d) for m, deps in graph.items() if m.startswith("megatron.tokenizer")
             for d in deps if d.startswith("megatron.data.corpora")}
    assert not reach, f"tokenizer modules import corpus modules: {sorted(reach)}"


# `noqa: F401` allowed: an `import x as _` availability probe and a package __init__ re-export.
def test_no_unused_import_kept_with_noqa():
    # an unused import silenced by noqa reads as a dependency that is not there
    found = []
    for path in sorted((REPO / "megatron").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "noqa: F401" not in line or path.name == "__init__.py" or " as _ " in f"{line} ":
                continue
            found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "unused imports kept with noqa (delete them or import where used):\n" + "\n".join(found)


def architecture_rows(text: str) -> list[set[str]]:
    """The rooms named in the first column of docs/architecture.md's folder table, row by row
    (`model/` -> model, `console.py` -> console)."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("| folder |"):
            inside = True
        elif inside and line.startswith("|") and not line.startswith("|---"):
            first = line.split("|")[1]
            rows.append({n.rstrip("/").removesuffix(".py") for n in re.findall(r"`([^`]+)`", first)})
        elif inside and not line.startswith("|"):
            break
    return rows


def test_the_architecture_table_lists_every_room_in_dependency_order():
    """docs/architecture.md's folder table, from the bottom: every room is in it, and none imports a
    room listed below it (the reader can take the rows in order)."""
    graph = import_graph(REPO, "megatron")
    rows = architecture_rows((REPO / "docs" / "architecture.md").read_text())
    row_of = {room: i for i, names in enumerate(rows) for room in names}
    rooms = {folder_of(m) for m in graph} - {None}
    assert rooms <= set(row_of), f"rooms missing from docs/architecture.md's table: {sorted(rooms - set(row_of))}"
    late = sorted({f"{folder_of(m)} imports {folder_of(d)} ({m} -> {d})" for m, deps in graph.items() for d in deps
                   if folder_of(m) and folder_of(d) and row_of[folder_of(d)] > row_of[folder_of(m)]})
    assert not late, "docs/architecture.md's table lists a room above one it imports:\n" + "\n".join(late[:10])
