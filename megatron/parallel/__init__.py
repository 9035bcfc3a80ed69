"""Tensor parallelism: explicit process-group context, CPU-safe dropout RNG, checkpoint merging."""
import warnings

# megatron-core warns at import that apex / Transformer Engine are absent (we use neither), and on
# every parallel layer that CUDA_DEVICE_MAX_CONNECTIONS is unset (a CUDA stream setting): noise.
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS")

from megatron.parallel.context import ParallelContext, context_for, init_parallel  # noqa: E402, F401
