"""Our training stack. megatron-core installs the namespace package `megatron.core` into
site-packages; extending __path__ lets `import megatron.core` resolve there while the rest of
`megatron.*` resolves to this directory."""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
