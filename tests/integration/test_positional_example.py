"""docs/positional.md's "Adding a positional scheme" example, run as written: the page shows
tests/fixtures/alibi_learned.py verbatim, and that file, dropped into megatron/positional (here: a
temporary directory on the package's path), is a whole scheme: it validates as a pos-emb, trains a
step, gives the same attention on the reference, SDPA and flex backends, and exports to Hugging
Face with no other file changed."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import megatron.positional as positional_package
from megatron.errors import UserError
from megatron.positional import registry

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "alibi_learned.py"
MODULE = "megatron.positional.alibi_learned"
CPU, F32 = torch.device("cpu"), torch.float32


def readme_example() -> str:
    text = (ROOT / "docs" / "positional.md").read_text(encoding="utf-8")  # moved from the README (issue 52)
    section = text[text.index("## Adding a positional scheme"):]
    return re.search(r"```python\n(.*?)```\n", section, re.S).group(1)


def test_readme_shows_the_fixture_verbatim():
    assert readme_example() == FIXTURE.read_text(encoding="utf-8")


@pytest.fixture
def scheme_file(tmp_path, monkeypatch):
    """Put a scheme file into megatron.positional without touching the source tree."""
    extra = tmp_path / "positional_extra"
    extra.mkdir()
    monkeypatch.setattr(positional_package, "__path__", [*positional_package.__path__, str(extra)])
    # Load every scheme first: a copy of a not-yet-filled registry would be restored empty, and
    # later tests in the same process would find no schemes (seen when this test ran first).
    registry.scheme_names()
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    added = []

    def add(source: str, name: str = "alibi_learned") -> None:
        (extra / f"{name}.py").write_text(source, encoding="utf-8")
        added.append(f"megatron.positional.{name}")

    yield add
    for name in added:
        sys.modules.pop(name, None)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_example_scheme_trains_agrees_across_backends_and_exports(tmp_path, tiny_config, scheme_file):
    from megatron.attention import resolve_backend
    from megatron.interop.hf_export import export_hf
    from megatron.model import GPTModel

    scheme_file(readme_example())
    cfg = tiny_config(pos_emb="alibi_learned")  # validates: the registry found the new file
    torch.manual_seed(0)
    model = GPTModel(cfg.model, 128)
    assert model.position.__module__ == MODULE and set(model.position.stats()) == {
        "slope_mean", "slope_std", "slope_max", "slope_min"}

    # one training step moves the learned slopes
    tokens = torch.randint(1, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    before = model.position.slope.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model(tokens, labels=tokens)
    loss.float().mean().backward()
    assert model.position.slope.grad.abs().sum() > 0
    opt.step()
    assert not torch.equal(model.position.slope.detach(), before)

    # reference, SDPA (forward and the slope gradient) and flex (CPU inference) agree
    scheme = model.position
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g) for _ in range(3))
    pos = torch.arange(9) + 100
    outs, grads = {}, {}
    for name in ("reference", "sdpa"):
        scheme.zero_grad()
        backend = resolve_backend(name, scheme, CPU, F32, True)
        outs[name] = backend.forward(q, k, v, scheme, pos, pos, window=4)
        outs[name].square().sum().backward()
        grads[name] = scheme.slope.grad.clone()
    torch.testing.assert_close(outs["sdpa"], outs["reference"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads["sdpa"], grads["reference"], rtol=1e-4, atol=1e-6)
    assert grads["reference"].abs().sum() > 0
    flex = resolve_backend("flex", scheme, CPU, F32, False)
    flex.eager_on_cpu = True  # no compile: the same score_mod, evaluated eagerly
    with torch.no_grad():
        torch.testing.assert_close(flex.forward(q, k, v, scheme, pos, pos, window=4), outs["reference"].detach(),
                                   rtol=1e-5, atol=1e-6)

    # the export ships the scheme's own file (and what it imports) and reproduces the logits in
    # a Python that cannot import megatron
    out = tmp_path / "hf"
    model.eval()
    export_hf(model, cfg, str(out))
    assert (out / "alibi_learned.py").read_text() == FIXTURE.read_text()
    assert {"alibi.py", "base.py", "distance_kernel.py", "registry.py"} <= set(os.listdir(out))
    exported = json.loads((out / "config.json").read_text())
    assert exported["pos_emb"] == "alibi_learned"
    # every model key reaches a scheme as spec.options, in training and in the export: a scheme's
    # own hyperparameter is one ModelConfig field
    assert model.position.spec.options["attention_window"] is None
    assert model.position.spec.options["rotary_emb_base"] == cfg.model.rotary_emb_base
    assert exported["positional_spec"]["options"] == model.position.spec.options
    with torch.no_grad():
        ours = model(tokens)
    torch.save(tokens, tmp_path / "tokens.pt")
    script = (
        "import sys; sys.modules['megatron'] = None\n"  # any absolute megatron import fails
        "import torch, transformers\n"
        f"hf = transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True, "
        "dtype=torch.float32).eval()\n"
        f"tokens = torch.load({str(tmp_path / 'tokens.pt')!r})\n"
        "with torch.no_grad():\n"
        f"    torch.save(hf(tokens).logits, {str(tmp_path / 'hf_logits.pt')!r})\n")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), PYTHONPATH="")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "hf_logits.pt"), ours, rtol=0, atol=1e-5)


def test_export_refuses_a_scheme_file_that_imports_megatron_absolutely(scheme_file):
    from megatron.interop.hf_export import positional_sources

    source = readme_example().replace("from .base import", "from megatron.positional.base import")
    scheme_file(source)
    with pytest.raises(UserError, match=r"alibi_learned\.py:\d+ imports megatron .*relatively"):
        positional_sources("alibi_learned")


OPTION_SCHEME = '''
from .alibi_learned_base import ALiBiLearned
from .options import Option
from .registry import register


@register("alibi_scaled")
class ALiBiScaled(ALiBiLearned):
    options = (Option("alibi_init_scale", float, 1.0, "Multiplies the initial slopes.", gt=0),)

    def __init__(self, spec):
        super().__init__(spec)
        self.slope.data *= self.option("alibi_init_scale")
'''


def test_a_new_scheme_files_option_is_a_config_key(tmp_path):
    """A scheme's own hyperparameter is declared once, in its file: the config loader then knows
    the key (typed, bounded, documented with the scheme reading it) and the scheme reads the value."""
    extra = tmp_path / "positional_extra"
    extra.mkdir()
    (extra / "alibi_learned_base.py").write_text(FIXTURE.read_text(encoding="utf-8").replace(
        '@register("alibi_learned")\n', ""), encoding="utf-8")
    (extra / "alibi_scaled.py").write_text(OPTION_SCHEME, encoding="utf-8")
    script = (
        "import megatron.positional as p, sys\n"
        f"p.__path__.append({str(extra)!r})\n"  # the file dropped into megatron/positional, as a user would
        "from megatron.config import ConfigError, load_config\n"
        "from megatron.config.docs import render\n"
        "from megatron.model import GPTModel\n"
        "tiny = {'num-layers': 1, 'hidden-size': 16, 'num-attention-heads': 4, 'seq-length': 8, 'train-iters': 1,\n"
        "        'train_micro_batch_size_per_gpu': 1, 'pos-emb': 'alibi_scaled'}\n"
        "one, two = (GPTModel(load_config([], overrides={**tiny, 'alibi-init-scale': s}).model, 32) for s in (1, 2))\n"
        "print('ratio', (two.position.slope / one.position.slope).tolist())\n"
        "print('doc', [line for line in render().splitlines() if 'alibi-init-scale' in line])\n"
        "try:\n"
        "    load_config([], overrides={**tiny, 'alibi-init-scale': -1})\n"
        "except ConfigError as e:\n"
        "    print('refused', e)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "ratio [2.0, 2.0, 2.0, 2.0]" in out
    assert "Multiplies the initial slopes. Used with pos-emb: `alibi_scaled`. Range: > 0." in out
    assert "alibi-init-scale = -1 (from -o on the command line): must be > 0" in out
