"""The rules between the position recipes (reset-position-ids, reset-attention-mask,
pos-random-max-length, PoSE's pos-skip-*) and the model and parallel layout they train: each
bad combination is one line naming the key and the fix, said by the dry run and by training
alike (both load the config through these rules, before anything is written)."""
from __future__ import annotations


def position_recipe_problems(cfg) -> list[tuple[str, str]]:
    d, m = cfg.data, cfg.model
    length = m.seq_length
    out = []
    if d.pos_random_max_length is not None and d.pos_random_max_length < length:
        out.append(("pos_random_max_length", f"{d.pos_random_max_length} is shorter than seq-length ({length}): the "
                    f"range [0, N) must hold the sequence's {length} distinct positions; set it to at least {length}"))
    if d.pos_skip_target_length is not None and d.pos_skip_target_length < length:
        out.append(("pos_skip_target_length", f"{d.pos_skip_target_length} is shorter than seq-length ({length}): "
                    f"PoSE stretches the sequence's positions to the target; set it to at least {length}"))
    if d.pos_skip_target_length is not None and isinstance(length, int) and d.pos_skip_chunks > length:
        out.append(("pos_skip_chunks", f"{d.pos_skip_chunks} chunks cannot cut a sequence of {length} tokens; "
                    f"use at most {length} (the paper uses 2)"))
    if d.pos_random_max_length is not None and d.pos_skip_target_length is not None:
        out.append(("pos_skip_target_length", "randomized positions and PoSE both draw the positions; set only one "
                    "of pos-random-max-length and pos-skip-target-length"))
    drawn = d.pos_random_max_length is not None or d.pos_skip_target_length is not None
    if d.reset_position_ids and drawn:
        out.append(("reset_position_ids", "positions restarting at each document and drawn positions contradict "
                    "each other; keep reset-attention-mask and drop reset-position-ids, or drop the draw"))
    if d.reset_position_ids and not d.reset_attention_mask:
        out.append(("reset_position_ids", "restarted positions with attention across documents would give a "
                    "relative scheme negative distances between documents; set reset-attention-mask: true too"))
    reach = max(d.pos_random_max_length or 0, d.pos_skip_target_length or 0)
    table = m.max_position_embeddings
    if m.pos_emb == "learned" and isinstance(table, int) and reach > table:
        key = "pos_random_max_length" if d.pos_random_max_length else "pos_skip_target_length"
        out.append((key, f"learned absolute positions have a table of max-position-embeddings = {table} rows and "
                    f"the recipe draws positions up to {reach - 1}; raise max-position-embeddings to {reach}, or use a "
                    "relative pos-emb"))
    recipe = drawn or d.reset_position_ids or d.reset_attention_mask
    if recipe and cfg.parallel.pipe_parallel_size >= 1:
        key = "reset_attention_mask" if d.reset_attention_mask else "reset_position_ids" if d.reset_position_ids \
            else "pos_random_max_length" if d.pos_random_max_length is not None else "pos_skip_target_length"
        out.append((key, f"position recipes are not wired into the pipeline engine (pipe-parallel-size "
                    f"{cfg.parallel.pipe_parallel_size}); set pipe-parallel-size: 0 to train with them"))
    return out
