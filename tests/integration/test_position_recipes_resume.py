"""Kill-and-resume is exact with each position recipe on (packed documents, randomized positions,
PoSE): the draws are a pure function of (seed, iteration, micro-step, rank), so the resumed steps
see the positions the uninterrupted run saw (tests/integration/test_train_resume.py's machinery)."""
import pytest

from tests.integration.test_train_resume import run_training

RECIPES = {
    "documents": {"reset_attention_mask": True, "reset_position_ids": True, "eod_mask_loss": True},
    "randomized": {"pos_random_max_length": 256},
    "pose": {"pos_skip_target_length": 256, "pos_skip_chunks": 3},
}


@pytest.mark.parametrize("recipe", RECIPES)
def test_resume_is_exact_with_the_recipe_on(tmp_path, token_dataset, recipe):
    keys = {**RECIPES[recipe], "train_iters": 4, "gradient_accumulation_steps": 2}
    ck = str(tmp_path / "ck")
    full, _, _ = run_training(tmp_path, token_dataset, "full", **keys)
    run_training(tmp_path, token_dataset, "half", save=ck, save_interval=2, exit_interval=2, **keys)
    resumed, _, _ = run_training(tmp_path, token_dataset, "resume", save=ck, load=ck, save_interval=2, **keys)
    assert [it for it, _ in resumed] == [3, 4]
    expect = dict(full)
    for it, loss in resumed:
        assert loss == expect[it], (recipe, it, loss, expect[it])
