"""The two CPU audits of issue 17 on one small config: the no-DP baseline (surrogate data) and ε = 3.

Model: a random-init Llama from tests/tiny.py (hidden 64, 2 layers, byte tokenizer; lm_head scaled by 5 so a
LoRA can move the logits), because SmolLM2-135M is too slow on 2 shared cores. Data: 8 demo tickets
(`dplora demo-data`, surrogate) at ticket level; 32 canaries of 8 records each, 1000 exposure candidates.

    PYTHONPATH=. python scripts/audit_cpu_runs.py WORKDIR
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def main(work: Path) -> None:
    from tiny import byte_tokenizer, tiny_llama

    from dplora.data.demo import write_tickets

    work.mkdir(parents=True, exist_ok=True)
    model = tiny_llama(hidden=64)
    model.lm_head.weight.data *= 5.0
    model.save_pretrained(work / "model")
    byte_tokenizer().save_pretrained(work / "model")
    write_tickets(work / "tickets.csv", num_tickets=8, seed=1, max_turns=1, overwrite=True)
    contract = {
        "privacy": {
            "protected_unit": "ticket",
            "unit_key": "ticket_id",
            "adjacency": "add_remove",
            "target_epsilon": 3.0,
            "delta": 1e-5,
            "accountant": "rdp",
            "max_grad_norm": 1.0,
        },
        "model": {"path": str(work / "model")},
        "data": {"path": str(work / "tickets.csv"), "prompt_column": "message", "response_column": "reply"},
        "lora": {
            "r": 8,
            "alpha": 16,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        },
        "training": {
            "expected_batch_size": 16,
            "physical_batch_size": 32,
            "steps": 150,
            "lr": 0.01,
            "max_seq_len": 128,
            "seed": 0,
            "output_dir": str(work / "run"),
            "threads": 1,
        },
    }
    (work / "audit.yaml").write_text(yaml.safe_dump(contract))
    common = ["--canaries", "32", "--copies", "8", "--candidates", "1000", "--no-progress", "--overwrite"]
    runs = {
        "baseline_no_dp": ["privacy.enabled=false", "--data-source", "surrogate", "--out", str(work / "baseline")],
        "dp_eps3": ["--data-source", "surrogate", "--out", str(work / "eps3")],
    }
    for name, extra in runs.items():
        started = time.time()
        cmd = [sys.executable, "-m", "dplora", "audit", str(work / "audit.yaml"), *extra, *common]
        rc = subprocess.run(cmd, check=False).returncode
        report = json.loads((Path(extra[-1]) / "audit.json").read_text())
        keys = ("epsilon_lower_bound", "claimed_epsilon", "exposure_inserted_mean", "exposure_held_out_mean", "mia_auc")
        print(name, "rc", rc, {k: report[k] for k in keys}, f"{(time.time() - started) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
