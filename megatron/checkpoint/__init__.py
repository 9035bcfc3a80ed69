"""Every checkpoint format in one home, below training/, evaluation/ and interop/ (it imports none
of them):

    errors.py           CheckpointError, CheckpointSaveError, UnsafeCheckpointError
    tags.py             tag_for (`global_step<N>`), the one `latest` reader/writer, tag validation
    layout.py           which layout a step directory is in (decided here only), its file names
    manifest.py         manifest.json: every file's size and hash, the layout, the model keys; written
                        last before `latest`, checked on every load and every file read (digest.py: the hashes)
    safe_load.py        every file is read here: the manifest, weights_only=True + allow-list, then finite.py
    finite.py           NaN/inf refusal
    deepspeed_engine.py DeepSpeed's own reads (engine.load_checkpoint, zero_to_fp32) routed to safe_load
    reader.py           read_tp1_state: any accepted layout -> one TP=1 GPTModel state dict
    tp_merge.py, pipeline.py, neox.py, neox_keys.py   the per-layout pieces reader.py uses
    client.py           the client state we save next to the weights (model args)
    writer.py           write_tp1_checkpoint (merge and convert) and the failed-write message

Importing the package imports nothing heavy; import the module you need.
"""
