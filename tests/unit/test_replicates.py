"""Which runs trained the same configuration (study/replicates.py)."""
import json
import os

from study.replicates import identities, trained_as, training_identity


def write_run(root, folder, name, seed=1235, warmup=0.1, base=("configs/base.yml",), steps=2000):
    """An experiment config as tools/make_experiments.py writes it, its matrix.json, and the record of the run."""
    d = os.path.join(root, "configs", folder)
    os.makedirs(d, exist_ok=True)
    run_dir = f"runs/{name}"
    config = {"pos-emb": "kerple_log", "seed": seed, "data-path": "data/code_text_document", "run-dir": run_dir,
              "save": f"{run_dir}/checkpoints", "load": f"{run_dir}/checkpoints",
              "tensorboard-dir": f"{run_dir}/tensorboard", "seq-length": 64, "warmup": warmup}
    with open(os.path.join(d, f"{name}.yml"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(d, "matrix.json"), "w") as f:
        json.dump({"base_configs": list(base), "runs": []}, f)
    return {"name": name, "scheme": "kerple_log", "label": "kerple_log", "dataset": folder, "seed": seed,
            "train_length": 64, "config": f"configs/{folder}/{name}.yml", "steps": steps}


def test_the_same_config_under_two_names_is_one_identity(tmp_path):
    root = str(tmp_path)
    a = write_run(root, "design_a", "kerple_log_design_a_L64_1235")
    b = write_run(root, "design_b", "kerple_log_design_b_L64_1235")
    assert training_identity(a, root) == training_identity(b, root) is not None


def test_what_trains_tells_runs_apart(tmp_path):
    root = str(tmp_path)
    a = write_run(root, "a", "run_a")
    assert training_identity(write_run(root, "b", "run_b", warmup=0.02), root) != training_identity(a, root)
    assert training_identity(write_run(root, "c", "run_c", seed=1236), root) != training_identity(a, root)
    assert training_identity(write_run(root, "d", "run_d", base=("configs/other.yml",)), root) != \
        training_identity(a, root)
    assert training_identity(write_run(root, "e", "run_e", steps=1000), root) != training_identity(a, root)


def test_a_config_that_cannot_be_read_is_never_merged(tmp_path):
    root = str(tmp_path)
    rec = write_run(root, "a", "run_a")
    os.remove(os.path.join(root, rec["config"]))
    assert training_identity(rec, root) is None
    assert training_identity({**rec, "config": None}, root) is None
    ids = identities([rec], root)
    assert trained_as(ids, "a", 64, "kerple_log", 1235) == ("run", "a", 64, "kerple_log", 1235)
    assert trained_as(ids, "a", 64, "kerple_log", 1235) != trained_as(ids, "b", 64, "kerple_log", 1235)


def test_the_windowed_evaluation_is_the_same_trained_model(tmp_path):
    root = str(tmp_path)
    ids = identities([write_run(root, "a", "run_a"), write_run(root, "b", "run_b")], root)
    same = trained_as(ids, "a", 64, "kerple_log", 1235)
    assert same[0] == "config"
    assert trained_as(ids, "a", 64, "kerple_log (window 64)", 1235) == same == trained_as(ids, "b", 64, "kerple_log", 1235)
