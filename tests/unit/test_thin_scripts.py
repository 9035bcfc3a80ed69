"""Scripts parse arguments and call the package (issue 57): every entry point and tool is under 150
lines, and no test imports a script or reaches tools/ through sys.path; what a test needs is in
megatron/ (or study/, benchmarks/) and imported from there."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("*.py"), *REPO.glob("tools/**/*.py")])
SCRIPT_MODULES = {p.stem for p in REPO.glob("*.py")} | {"tools"}
MAX_LINES = 150


def test_every_script_is_under_150_lines():
    assert len(SCRIPTS) > 10, "found too few scripts: is REPO right?"
    long = {str(p.relative_to(REPO)): n for p in SCRIPTS if (n := len(p.read_text().splitlines())) >= MAX_LINES}
    assert not long, f"scripts of {MAX_LINES} lines or more (move their logic into the package): {long}"


def test_no_test_imports_a_script_or_edits_sys_path():
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(REPO)}:{node.lineno}: imports {n}" for n in names
                      if n.split(".")[0] in SCRIPT_MODULES]
            found += [f"{path.relative_to(REPO)}:{node.lineno}: {what}" for what in _reaches_a_script(node, path)]
        for m in re.finditer(r"(sys\.path\.(insert|append)|spec_from_file_location|run_path)\([^)\n]*tools", text):
            found.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert not found, "tests reaching scripts (import the package module instead):\n" + "\n".join(found)


def _reaches_a_script(node, path: Path) -> list[str]:
    """A sys.path edit in a test's own code (tests/conftest.py's repo root, which makes `megatron`
    importable, excepted; code in strings run by a child process is not parsed, so it is not seen),
    or __import__ / importlib.import_module of a script by name (the detector above saw only
    import statements, and two tests reached evaluate.py and tools/ this way)."""
    if not isinstance(node, ast.Call):
        return []
    f = node.func
    if (isinstance(f, ast.Attribute) and f.attr in ("insert", "append") and isinstance(f.value, ast.Attribute)
            and f.value.attr == "path" and isinstance(f.value.value, ast.Name) and f.value.value.id == "sys"):
        return [] if path == REPO / "tests" / "conftest.py" else ["edits sys.path"]
    called = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    if called in ("__import__", "import_module") and node.args and isinstance(node.args[0], ast.Constant) \
            and str(node.args[0].value).split(".")[0] in SCRIPT_MODULES:
        return [f"imports the script {node.args[0].value}"]
    return []
