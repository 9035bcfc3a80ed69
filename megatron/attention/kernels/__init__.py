"""Hand-written kernels (Triton). Imported lazily by the backends that use them: importing
triton is optional, and TRITON_INTERPRET=1 must be set before these modules are imported for
the kernels to run on CPU tensors in Triton's interpreter (tests do that on machines without
CUDA)."""
