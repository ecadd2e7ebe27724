"""A row-level contract over a small csv and a tiny model folder, shared by the mechanism, accounting and recipe
attacks (tests/mechanism/test_mechanism_wrap_attacks.py, tests/accounting/test_accountant_registry_attacks.py,
tests/recipe/test_run_options_attacks.py) and the slow tests/slow/recipe/test_control_run_attacks.py."""

from __future__ import annotations


def contract_raw(tmp_path, model_dir, *, rows=8, privacy=None, training=None):
    """The raw contract dict: ``rows`` records written to ``tmp_path/data.csv``, N declared as ``rows``; ``privacy``
    and ``training`` update the defaults."""
    csv = tmp_path / "data.csv"
    csv.write_text("text\n" + "".join(f"record {i} asks about order {1000 + i}\n" for i in range(rows)))
    return {
        "privacy": {
            "protected_unit": "row", "adjacency": "add_remove", "target_epsilon": 50.0, "delta": 1e-5,
            "accountant": "rdp", "max_grad_norm": 1.0, "noise_multiplier": 1.0, "num_units": rows,
            **(privacy or {}),
        },
        "model": {"path": str(model_dir)},
        "data": {"path": str(csv), "text_column": "text"},
        "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        "training": {
            "physical_batch_size": 16, "lr": 0.05, "optimizer": "sgd", "max_seq_len": 16, "expected_batch_size": 2,
            "steps": 3, "output_dir": str(tmp_path / "run"), "threads": 1, **(training or {}),
        },
    }  # fmt: skip
