"""Parameters are named for what they hold (`model_cfg`, `parallel`), not with short aliases
(`mcfg`, `par`, `ccfg`): a reader of a signature should not have to look up the caller."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHORT_ALIASES = {"mcfg", "par", "ccfg"}


def short_alias_parameters(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            a = node.args
            for arg in a.posonlyargs + a.args + a.kwonlyargs:
                if arg.arg in SHORT_ALIASES:
                    out.append(f"{getattr(node, 'name', 'lambda')}({arg.arg}) line {node.lineno}")
    return out


def _sources():
    return sorted([*(REPO / "megatron").rglob("*.py"), *(REPO / "tools").glob("*.py"), *REPO.glob("*.py")])


def test_no_short_aliases_in_signatures():
    found = {p.relative_to(REPO).as_posix(): short_alias_parameters(p) for p in _sources()}
    bad = {f: hits for f, hits in found.items() if hits}
    assert not bad, f"rename these parameters (mcfg -> model_cfg, par -> parallel, ...): {bad}"


def test_the_scan_sees_a_short_alias(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f(x, mcfg):\n    pass\n\ng = lambda par: par\n")
    assert short_alias_parameters(f) == ["f(mcfg) line 1", "lambda(par) line 4"]
