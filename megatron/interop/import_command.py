"""Import a released Hugging Face model (Pythia / GPT-NeoX-20B, Llama, Mistral, as transformers'
save_pretrained writes them) as a checkpoint of this stack (megatron/interop/hf_import.py):

    python tools/import_hf.py --input pythia-160m/ --output ckpts/pythia-160m
    python evaluate.py --checkpoint ckpts/pythia-160m -o data-path=data/mydata_text_document --max-factor 4

The output is a TP=1 checkpoint (step 0) with the architecture written as NeoX keys in its
resolved_config.yml (a scaled RoPE, config.json's rope_scaling / rope_parameters of type linear,
dynamic, yarn or llama3, as rotary-scaling keys) and the tokenizer copied beside it; evaluate.py,
generate.py, tools/export_hf.py and training (`load:` with `finetune: true`) accept it.
"""
from __future__ import annotations

from megatron.cli_args import input_output_parser


def main(argv=None) -> int:
    p = input_output_parser(__doc__, "the HF model directory (config.json + safetensors or .bin)",
                            "the checkpoint directory to write")
    args = p.parse_args(argv)
    from megatron.interop.hf_import import import_hf  # lazy: pulls in torch and the config: --help and flag errors need none

    step, cfg = import_hf(args.input, args.output, args.overwrite)
    m = cfg.model
    scaling = (f", rotary-scaling {m.rotary_scaling} (factor {m.rotary_scaling_factor:g}, original length "
               f"{m.rotary_scaling_original_length})" if m.rotary_scaling != "none" else "")
    print(f"wrote {step}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads, "
          f"{cfg.describe().splitlines()[1].split(None, 1)[1]}{scaling}")
    return 0
