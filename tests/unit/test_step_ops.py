"""The operations one training step dispatches outside the attention kernel (benchmarks/step_ops.py),
per positional scheme: on a GPU each is a kernel launch, so a scheme that dispatches more of them
per layer than ALiBi pays for it in every layer of every step (issue 42: the 162M step with
KERPLE-log cost +42% over ALiBi on the same fused kernel).

The Triton kernels never run here: their launch sites are wrapped by a stand-in that counts one
launch each (the wrapper's own torch work around them still runs and is counted). Each scheme
runs on the backend `auto` picks on CUDA (triton for a bias, SDPA without), with activation
checkpointing, gradient clipping and AdamW (foreach, CUDA's default)."""
import pytest
import torch

from benchmarks.step_ops import count_step, is_launch, use_foreach
from megatron.config.scheme_options import scheme_names
from megatron.model import GPTModel
from megatron.training.optim import build_optimizer

# What KERPLE-log may dispatch beyond ALiBi in a whole step, whatever the depth: the clamp of its
# two parameters (3 operations each, once per forward) and the one reduction of their gradients
# over every layer (stack + sum), the copies the optimizer's layout wants of those gradients.
KERPLE_OVER_ALIBI = 10
SCHEMES = {"none": "sdpa", "alibi": "triton", "kerple_log": "triton"}


def counted_training_step(cfg, model, tokens: torch.Tensor):
    """One full step of `model` on tokens (B, L + 1), counted: forward, backward, gradient
    clipping and the project's AdamW (foreach)."""
    optimizer = build_optimizer(cfg, model.train())
    use_foreach(optimizer)

    def step():
        optimizer.zero_grad(set_to_none=True)
        model(tokens[:, :-1], labels=tokens[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return count_step(step, optimizer, torch.device("cpu"))


def fixed_tokens() -> torch.Tensor:
    return torch.randint(0, 128, (2, 17), generator=torch.Generator().manual_seed(0))


def counted(tiny_config, pos: str, layers: int, checkpointing: bool = True):
    cfg = tiny_config(pos_emb=pos, num_layers=layers, attention_backend=SCHEMES[pos])
    torch.manual_seed(0)
    model = GPTModel(cfg.model, 128, checkpoint_activations=checkpointing)
    return counted_training_step(cfg, model, fixed_tokens())


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """{(scheme, layers): StepOps} for 2 and 4 layers (one fixture: each model is built once)."""
    from megatron.config import load_config
    from tests.conftest import TINY_MODEL, write_yaml

    root = tmp_path_factory.mktemp("step_ops")

    def tiny_config(**over):
        data = {**TINY_MODEL, "run-dir": str(root / "run")}
        data.update({k.replace("_", "-"): v for k, v in over.items()})
        return load_config([write_yaml(root / "tiny.yml", data)])

    return {(pos, n): counted(tiny_config, pos, n) for pos in SCHEMES for n in (2, 4)}


def per_layer(counts, pos: str) -> float:
    return (counts[(pos, 4)].launches - counts[(pos, 2)].launches) / 2


def test_kerple_log_adds_no_launch_per_layer_over_alibi(counts):
    extra = {n: counts[("kerple_log", n)].launch_ops() - counts[("alibi", n)].launch_ops() for n in (2, 4)}
    assert per_layer(counts, "kerple_log") == per_layer(counts, "alibi"), extra
    for n in (2, 4):
        over = counts[("kerple_log", n)].launches - counts[("alibi", n)].launches
        assert 0 < over <= KERPLE_OVER_ALIBI, (n, over, extra[n])
        assert extra[2] == extra[4]  # the same operations at any depth


def test_the_fused_kernel_launches_three_kernels_per_layer(counts):
    """Forward, its recomputation under activation checkpointing, and the two backward kernels:
    each a launch of the stand-in, none of them a torch operation."""
    for pos in ("alibi", "kerple_log"):
        for n in (2, 4):
            assert dict(counts[(pos, n)].attention) == {"attention_fwd_kernel": 2 * n, "attention_bwd_dkdv_kernel": n,
                                                        "attention_bwd_dq_kernel": n}
    assert sum(counts[("none", 2)].attention.values()) == 2 * 2 + 2  # SDPA: forward twice, backward once


@pytest.mark.parametrize("pos", list(SCHEMES))
def test_no_host_sync_in_a_step(counts, pos):
    """The positions' layout check (megatron/attention/mask.py consecutive_starts) answers on the
    host for the positions the model makes (position_run): it was one sync per forward. The
    optimizer's step counters are host tensors and do not count."""
    for n in (2, 4):
        assert counts[(pos, n)].syncs == [], counts[(pos, n)].where


def test_fused_scheme_per_layer_overhead_over_none_is_bounded(counts):
    """Beyond SDPA without a bias, a fused-kernel layer adds the backward's delta = rowsum(dO * O)
    (a product and a sum; FlashAttention computes it in a kernel of its own too) and nothing else."""
    assert per_layer(counts, "alibi") - per_layer(counts, "none") <= 2, (
        counts[("alibi", 4)].launch_ops() - counts[("none", 4)].launch_ops())


def test_views_and_allocations_are_not_launches():
    from benchmarks.step_ops import StepOps, _Recorder

    record = StepOps()
    x = torch.ones(4, 4)
    with _Recorder(record, set()):
        y = x.view(16)[:3].unsqueeze(0)
        torch.empty(3)
        z = y + 1
        z.sum().item()
    assert is_launch("aten::add") and not is_launch("aten::empty") and not is_launch("aten::t")
    assert record.launches == 2  # add, sum
    assert record.syncs == ["aten::_local_scalar_dense"]


# ---- the pipeline model (deepy.py's path for the paper's config: pipe-parallel-size 1) ----------
def pipe_counted(root, pos: str, layers: int):
    """One train_batch of DeepSpeed's pipeline engine (one stage, activation checkpointing,
    gradient clipping, AdamW foreach) around GPTPipe, counted as count_step counts."""
    import itertools

    from megatron.config import load_config
    from megatron.process.distributed import init_distributed
    from megatron.training.pipeline_step import build_pipeline_engine
    from megatron.training.schedule import build_scheduler
    from tests.conftest import TINY_MODEL, write_yaml

    init_distributed("cpu")  # one process (gloo): the pipeline module needs a process group
    data = {**TINY_MODEL, "run-dir": str(root / "run"), "pos-emb": pos, "num-layers": layers,
            "attention-backend": SCHEMES[pos], "pipe-parallel-size": 1, "checkpoint-activations": True,
            "gradient-clipping": 1.0, "train-iters": 10, "optimizer": {"type": "Adam", "params": {"lr": 0.003}}}
    cfg = load_config([write_yaml(root / f"pipe_{pos}_{layers}.yml", data)])

    def optimizer_for(module):
        optimizer = build_optimizer(cfg, module)
        use_foreach(optimizer)
        return optimizer

    torch.manual_seed(0)
    engine, _ = build_pipeline_engine(cfg, 128, optimizer_for, lambda o: build_scheduler(cfg, o))
    tokens = fixed_tokens()
    batch = ((tokens[:, :-1],), (tokens[:, 1:], torch.ones(2, 16)))
    return count_step(lambda: engine.train_batch(itertools.repeat(batch)), engine.optimizer, torch.device("cpu"))


@pytest.fixture(scope="module")
def pipe_counts(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipe_ops")
    return {(pos, n): pipe_counted(root, pos, n) for pos in SCHEMES for n in (2, 4)}


@pytest.mark.parametrize("pos", list(SCHEMES))
def test_the_pipeline_model_reads_the_device_only_in_deepspeeds_optimizer(pipe_counts, pos):
    """GPTPipe builds the attention context once per forward of a stage, as GPTModel does, not in
    every layer and recomputed layer (2 syncs per layer before), and its positions' layout check
    answers on the host (one sync per forward before). What is left is DeepSpeed's own (none in
    its fp32 path with clipping, counted here)."""
    for n in (2, 4):
        record = pipe_counts[(pos, n)]
        assert not any("pipeline." in w or "mask." in w for w in record.where), record.where
        assert record.syncs == [], record.where


def test_the_pipeline_model_adds_no_launch_per_layer_for_kerple(pipe_counts):
    """KERPLE-log's clamps and its gradients' reduction once per forward, as in GPTModel
    (test_kerple_log_adds_no_launch_per_layer_over_alibi): per layer it launches what ALiBi does.
    Beyond GPTModel's +10, the pipe engine's gradient clipping (DeepSpeed's, a norm, a scale and a
    copy per parameter) pays for KERPLE's two parameters: +6."""
    extra = {n: pipe_counts[("kerple_log", n)].launch_ops() - pipe_counts[("alibi", n)].launch_ops() for n in (2, 4)}
    per_layer = {pos: (pipe_counts[(pos, 4)].launches - pipe_counts[(pos, 2)].launches) / 2 for pos in SCHEMES}
    assert per_layer["kerple_log"] == per_layer["alibi"], extra
    assert extra[2] == extra[4]
    assert 0 < pipe_counts[("kerple_log", 2)].launches - pipe_counts[("alibi", 2)].launches <= KERPLE_OVER_ALIBI + 6


# ---- FlexAttention: the scheme's kernel once per forward ---------------------------------------
@pytest.fixture(scope="module")
def flex_counts(tmp_path_factory):
    """{(scheme, layers): StepOps} of one inference forward on flex (its kernel a counted stand-in)."""
    from megatron.attention.flex import FlexAttention
    from megatron.config import load_config
    from tests.conftest import TINY_MODEL, write_yaml

    root = tmp_path_factory.mktemp("flex_ops")
    saved, FlexAttention.eager_on_cpu = FlexAttention.eager_on_cpu, True  # no C++ compiler needed: nothing runs
    try:
        out = {}
        for pos in ("kerple_log", "alibi", "sandwich"):
            for n in (2, 4):
                data = {**TINY_MODEL, "run-dir": str(root / "run"), "pos-emb": pos, "num-layers": n,
                        "attention-backend": "flex"}
                torch.manual_seed(0)
                model = GPTModel(load_config([write_yaml(root / "flex.yml", data)]).model, 128).eval()
                tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
                out[(pos, n)] = count_step(torch.no_grad()(lambda m=model, t=tokens: m(t)), None, torch.device("cpu"))
        return out
    finally:
        FlexAttention.eager_on_cpu = saved


def test_flex_builds_the_scheme_kernel_once_per_forward(flex_counts):
    """Flex's prepared state holds the scheme's kernel (FlexPrepared), as triton's does: KERPLE-log's
    clamps run once per forward, not in every layer (3 operations per parameter per layer before),
    and Sandwich's table covers the largest distance once, without reading the offset back from
    the device in every layer (a host sync per layer before), nor once per forward (the layout
    check answers on the host for the model's own positions)."""
    for pos in ("kerple_log", "alibi", "sandwich"):
        for n in (2, 4):
            record = flex_counts[(pos, n)]
            assert record.attention == {"flex_attention": n}
            assert record.syncs == [], (pos, n, record.where)
    per_layer = {pos: flex_counts[(pos, 4)].launches - flex_counts[(pos, 2)].launches for pos in ("kerple_log", "alibi")}
    assert per_layer["kerple_log"] == per_layer["alibi"], (
        flex_counts[("kerple_log", 4)].launch_ops() - flex_counts[("alibi", 4)].launch_ops())


# ---- every scheme: no host sync in a training step, a forward or a decoded token ----------------
def scheme_model(root, pos: str, backend: str):
    from megatron.config import load_config
    from tests.conftest import TINY_MODEL, write_yaml

    data = {**TINY_MODEL, "run-dir": str(root / "run"), "pos-emb": pos, "attention-backend": backend}
    cfg = load_config([write_yaml(root / f"{pos}_{backend}.yml", data)])
    torch.manual_seed(0)
    return cfg, GPTModel(cfg.model, 128, checkpoint_activations=True)


@pytest.mark.parametrize("backend", ["auto", "reference"])  # auto on the CPU: SDPA where it can
@pytest.mark.parametrize("pos", scheme_names())
def test_no_scheme_reads_the_device_in_a_step_a_forward_or_a_decoded_token(tmp_path, pos, backend):
    """On a GPU a read of the device stops the host from queueing kernels until the device is idle.
    The model's own positions (position_run) let every layout check, table cover and bounds
    check answer on the host: before, a step synced once (the positions' check) to 6 times
    (learned's bounds, xPos's span per layer, T5's bucket check per layer, Sandwich's largest
    distance, the reference's empty-row check per layer), and each decoded token 3 times or more."""
    cfg, model = scheme_model(tmp_path, pos, backend)
    tokens = fixed_tokens()
    assert counted_training_step(cfg, model, tokens).where == []
    model.eval()
    with torch.no_grad():
        assert count_step(lambda: model(tokens), None, torch.device("cpu")).where == []
        cache = model.new_cache()
        model(tokens[:, :8], cache=cache)
        for i in (8, 9):  # the first decoded token, then one on top of a decoded one
            assert count_step(lambda i=i: model(tokens[:, i:i + 1], cache=cache), None, torch.device("cpu")).where == []
