"""Downstream tasks through lm-evaluation-harness (`lm-eval`, pinned in requirements.txt).

    adapter.py      KerpleLM: the harness's LM interface over our checkpoints
    batching.py     padded batches: scoring right-padded, generation left-padded through the kv-cache
    local_tasks.py  offline tasks built from the bundled stdlib corpus, registered as harness YAML
    task_checks.py  finding tasks (local, --include-path, the harness's) and checking them before the model loads
    ruler.py        lm-eval's offline RULER tasks at --ruler-lengths, sized with the checkpoint's own tokenizer
    run.py          the evaluation, the results file, TensorBoard/W&B

Entry points: `python deepy.py eval.py CONFIG.yml --eval_tasks ...` and
`python evaluate.py --checkpoint DIR --tasks ...`. Nothing here imports lm_eval at module import
time except adapter.py (the harness's import costs ~2 s; evaluate.py's perplexity sweep never pays it).
"""
