"""Tensor parallelism from outside the model: the process-group context, the plan that shards a
built model (plan.py) and its inverse, the checkpoint merge (merge.py); a CPU-safe dropout RNG."""
import warnings

# megatron-core warns at import that apex / Transformer Engine are absent (we use neither), and on
# every parallel layer that CUDA_DEVICE_MAX_CONNECTIONS is unset (a CUDA stream setting): noise.
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS")

from megatron.parallel.context import ParallelContext, context_for, init_parallel  # noqa: E402, F401
from megatron.parallel.plan import parallelize  # noqa: E402, F401
