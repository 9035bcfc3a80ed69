from megatron.model.gpt import GPTModel, count_parameters  # noqa: F401
