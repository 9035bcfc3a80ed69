"""Parallelism from outside the model: the process-group context, the plan that shards a built
model for tensor parallelism (plan.py) and its inverse, the checkpoint merge (merge.py); the
pipeline split (pipeline.py: the same blocks as DeepSpeed's PipelineModule, GPT-NeoX's layer
numbering); a CPU-safe dropout RNG. model/ builds one rank's plain modules and imports neither
this folder nor DeepSpeed (tests/unit/test_import_cycles.py)."""
import warnings

# megatron-core warns at import that apex / Transformer Engine are absent (we use neither), and on
# every parallel layer that CUDA_DEVICE_MAX_CONNECTIONS is unset (a CUDA stream setting): noise.
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS")

from megatron.parallel.context import ParallelContext, context_for, init_parallel  # noqa: E402, F401
from megatron.parallel.plan import parallelize  # noqa: E402, F401
