"""scripts/utility_bench.py --toy (issue 31): the Bitext task trains on one-turn conversations through the chat
template and its held-out loss counts exactly the assistant spans of the template's rendering."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import needs_shared, release_statement

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore:Unexpected keyword arguments:UserWarning"),
]


def _bench():
    spec = importlib.util.spec_from_file_location("utility_bench", ROOT / "scripts" / "utility_bench.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["utility_bench"] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@needs_shared("data", "bitext_customer_support")
def test_toy_bitext_is_trained_and_scored_through_the_template(tmp_path):
    from transformers import AutoTokenizer

    bench = _bench()
    report = bench.main(["--toy", "--only", "bitext", "--out", str(tmp_path / "u"), "--threads", "1"])
    rows = {r["name"]: r for r in report["rows"]}
    assert set(rows) == {"base", "non-private", "dp-eps3"}
    template = (tmp_path / "u" / "toy-model" / "chat_template.jinja").read_text()
    for name in ("non-private", "dp-eps3"):
        tokenization = release_statement(Path(rows[name]["folder"]))["predicate"]["tokenization"]
        assert tokenization == {
            "record_format": "messages",
            "train_on": "assistant",
            "chat_template": "model",
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest(),
        }
    # the held-out targets, by hand: what the assistant turn adds after the generation prompt (no truncation here)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "u" / "toy-model")
    _, held = bench.bitext_data(bench.TOY, tmp_path)
    assert held[0]["messages"][0]["role"] == "user" and held[0]["messages"][1]["role"] == "assistant"
    expected = 0
    for record in held:
        turns = record["messages"]
        context = tokenizer.apply_chat_template(turns[:1], tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(turns, tokenize=False)
        n_full = len(tokenizer(full, add_special_tokens=False)["input_ids"])
        assert n_full <= bench.TOY.bitext.max_seq_len
        expected += n_full - len(tokenizer(context, add_special_tokens=False)["input_ids"])
    for row in rows.values():
        assert row["eval"]["tokens"] == expected and row["eval"]["records"] == len(held) == 6
        assert math.isfinite(row["eval"]["loss"]) and row["eval"]["loss"] > 0
    assert json.loads((tmp_path / "u" / "utility.json").read_text())["mode"] == "toy"


@needs_shared("data", "bitext_customer_support")
def test_toy_full_has_every_row_kind_and_the_share_of_the_control_gain(tmp_path):
    """The --full design (issue 33) at toy size on Bitext: base, the control at the planner's B and T, DP with the
    planner's choice and DP with the demo's hand settings; the share and the goal follow from the reported means."""
    bench = _bench()
    out = tmp_path / "u"
    argv = ["--toy", "--full", "--only", "bitext", "--epsilons", "8", "--repeats", "1", "--out", str(out)]
    report = bench.main([*argv, "--threads", "1"])
    assert report["mode"] == "toy-full" and report["settings"]["repeats"] == 1
    rows = {r["name"]: r for r in report["rows"]}
    assert set(rows) == {"base", "non-private", "dp-planner-eps8", "dp-hand-eps8"}
    assert [r["kind"] for r in report["rows"]] == ["base", "control", "dp-planner", "dp-hand"]
    control, planner, hand = (rows[n] for n in ("non-private", "dp-planner-eps8", "dp-hand-eps8"))
    # the control trains non-privately at the planner's B, T, lr and schedule (its choice at ε = 8)
    assert control["sigma"] == 0 and control["epsilon_spent"] is None and 0 < planner["epsilon_spent"] <= 8
    assert planner["sigma"] > 0 and hand["sigma"] > 0
    keys = ("batch", "steps", "lr", "lr_schedule")
    assert [control[k] for k in keys] == [planner[k] for k in keys] and planner["lr_schedule"] == "constant"
    # the hand row: configs/demo.yaml's B = 32 and lr 0.002 (constant) at the task's epochs, T = ceil(E·N/32)
    n, epochs = bench.TOY_FULL.max_train_rows, bench.TOY_FULL.bitext.epochs  # every training row is a unit
    assert (hand["batch"], hand["lr"], hand["lr_schedule"]) == (32, 0.002, "constant")
    assert hand["steps"] == math.ceil(epochs * n / 32) == 50
    for r in (control, planner, hand):
        assert len(r["repeats"]) == 1 and r["spread"] == {"loss": None, "perplexity": None} and r["minutes"] > 0
        assert r["eval"]["loss"] == r["repeats"][0]["eval"]["loss"] and r["eval"]["records"] == 6
    base, ctrl = rows["base"]["eval"]["loss"], control["eval"]["loss"]
    share = report["share_of_control_gain"]["bitext"]
    assert share["control_gain"] == pytest.approx(base - ctrl)
    for kind, r in (("dp-planner", planner), ("dp-hand", hand)):
        assert share["by_epsilon"]["8"][kind] == pytest.approx((base - r["eval"]["loss"]) / (base - ctrl))
    s8 = share["by_epsilon"]["8"]["dp-planner"]
    assert report["goal"] == {"bitext": {"epsilon": 8, "share_of_control_gain": s8, "required": 0.9, "met": s8 >= 0.9}}
    md = (out / "utility.md").read_text()
    assert "| bitext | dp-hand-eps8 | 8 | 32 | 50 |" in md and f"| {s8:.3f} |" in md
    assert json.loads((out / "utility.json").read_text())["hardware"].startswith(("CPU", "GPU"))


def _row(task, name, kind, metric, value, epsilon=None):
    return {"task": task, "name": name, "kind": kind, "epsilon": epsilon, "eval": {metric: value}}


def test_share_and_goal_arithmetic_on_known_numbers():
    """Banking77 accuracy share (dp − base)/(control − base) and the 3-point check; Bitext loss share
    (base − dp)/(base − control) and the 90 % check; no share when the control gains nothing."""
    bench = _bench()
    rows = [
        _row("banking77", "base", "base", "accuracy", 0.50),
        _row("banking77", "non-private", "control", "accuracy", 0.90, 8),
        _row("banking77", "dp-planner-eps8", "dp-planner", "accuracy", 0.86, 8),  # 4 points behind: not met
        _row("banking77", "dp-hand-eps8", "dp-hand", "accuracy", 0.70, 8),
        _row("bitext", "base", "base", "loss", 2.5),
        _row("bitext", "non-private", "control", "loss", 1.5, 8),
        _row("bitext", "dp-planner-eps3", "dp-planner", "loss", 1.7, 3),
        _row("bitext", "dp-planner-eps8", "dp-planner", "loss", 1.59, 8),  # 91 % of the gain: met
    ]
    share = bench.shares(rows)
    assert share["banking77"]["by_epsilon"]["8"] == {
        "dp-planner": pytest.approx(0.9),
        "dp-hand": pytest.approx(0.5),
    }
    assert share["bitext"]["by_epsilon"]["3"]["dp-planner"] == pytest.approx(0.8)
    assert share["bitext"]["by_epsilon"]["8"]["dp-planner"] == pytest.approx(0.91)
    goal = bench.goal_full(rows, share)
    assert goal["banking77"] == {"epsilon": 8, "control_minus_dp_points": 4.0, "required_points": 3.0, "met": False}
    assert goal["bitext"]["met"] is True
    rows[7]["eval"]["loss"] = 1.61  # 89 % of the gain
    assert bench.goal_full(rows, bench.shares(rows))["bitext"]["met"] is False
    rows[1]["eval"]["accuracy"] = 0.50  # the control gains nothing: no share
    assert bench.shares(rows)["banking77"]["by_epsilon"]["8"] == {"dp-planner": None, "dp-hand": None}


@needs_shared("data", "banking77")
def test_cpu_preset_is_plannable_and_sized_as_documented(tmp_path):
    """--cpu (issue 33): both tasks at ε = 3 and 8. Banking77 N = 554 (exchange_rate has 112 rows,
    lost_or_stolen_card 82) at E = 3 and Bitext N = 1,600 at E = 1: the planner's only eligible choice is B = 32 with
    T = 52 and 50 (B = 48 gives T = 35 and 34 < 50), which are the hand settings, so each DP-hand row points at the
    DP-planner row (``same_as``) instead of training again; the docs' estimate counts those trainings."""
    from dplora.accounting.events import Accountant, Adjacency
    from dplora.plan.planner import recommend

    bench = _bench()
    cpu = bench.CPU
    assert cpu.tasks == ("banking77", "bitext") and cpu.repeats == 1
    assert cpu.epsilons == (3.0, 8.0) == cpu.hand_epsilons
    bank_path, test, labels = bench.banking_data(cpu, tmp_path)
    bitext_path, held = bench.bitext_data(cpu, tmp_path)
    assert (bench._count_rows(bank_path), len(test), len(labels)) == (554, 60, 5)
    assert (bench._count_rows(bitext_path), len(held)) == (1600, 100)
    cases = [
        (cpu.banking, bank_path, {"prompt_column": "text", "response_column": "category"}, 554, 52),
        (cpu.bitext, bitext_path, {"record_format": "messages", "messages_column": "messages"}, 1600, 50),
    ]
    for task, path, columns, n, steps in cases:
        specs = bench.run_specs(task, cpu)
        names = ["non-private", "dp-planner-eps3", "dp-planner-eps8", "dp-hand-eps3", "dp-hand-eps8"]
        assert [s["name"] for s in specs] == names
        for eps in (3.0, 8.0):
            rec = recommend(
                num_units=n,
                target_epsilon=eps,
                delta=cpu.delta,
                accountant=Accountant(cpu.accountant),
                adjacency=Adjacency("add_remove"),
                lr_ref=task.lr,
                epochs=task.epochs,
            )
            assert (
                (rec.choice.expected_batch_size, rec.choice.steps)
                == (32, steps)
                == (32, math.ceil(task.epochs * n / 32))
            )
            planner_row = {"name": f"dp-planner-eps{eps:g}", "kind": "dp-planner", "epsilon": eps, "eval": {"x": 1}}
            done = {planner_row["name"]: planner_row}
            hand_spec = next(s for s in specs if s["name"] == f"dp-hand-eps{eps:g}")
            twin = bench._same_settings_row(hand_spec, done, task, cpu, path, columns, tmp_path, None)
            assert twin == planner_row | {"name": hand_spec["name"], "kind": "dp-hand", "same_as": planner_row["name"]}
            assert bench._same_settings_row(hand_spec, {}, task, cpu, path, columns, tmp_path, None) is None
    # a reference lr other than the hand lr: the planner's B = 32 row has lr 0.01, so the hand row is trained
    other = bench.dataclasses.replace(cpu, banking=bench.dataclasses.replace(cpu.banking, lr=0.01))
    spec = {"name": "dp-hand-eps8", "kind": "dp-hand", "arm": "hand", "epsilon": 8.0}
    done = {"dp-planner-eps8": {"name": "dp-planner-eps8"}}
    assert bench._same_settings_row(spec, done, other.banking, other, bank_path, cases[0][2], tmp_path, None) is None
    assert "T = 52" in cpu.label and "N = 554" in cpu.label and "N = 1,600" in cpu.label and "T = 50" in cpu.label
    docs = (ROOT / "docs" / "utility.md").read_text()
    assert "N = 554" in docs and "N = 1,600" in docs and "6 trainings" in docs


def test_max_steps_caps_t_of_every_arm_and_the_contract_accepts_it(tmp_path):
    """--max-steps K (the GPU check's dry run, issue 47): the planner arm gets ``steps: K`` (a step cap that lowers
    the planner's floor), the hand and plain arms ``steps: K`` instead of their epochs; without it nothing changes."""
    from dplora.contract.loader import parse_contract

    bench = _bench()
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}", "response": "r"}) + "\n" for i in range(200)))
    task = bench.dataclasses.replace(bench.TOY_FULL.bitext, max_steps=10)
    cols = {"prompt_column": "prompt", "response_column": "response"}
    planner = bench.contract_for(task, bench.TOY_FULL, data, cols, tmp_path / "o", arm="planner", epsilon=8.0)
    assert planner["training"]["steps"] == 10 and planner["training"]["epochs"] == task.epochs
    for arm in ("hand", None):
        t = bench.contract_for(task, bench.TOY_FULL, data, cols, tmp_path / "o", arm=arm, epsilon=8.0)["training"]
        assert t["steps"] == 10 and "epochs" not in t
    for arm in ("planner", "hand"):
        parse_contract(bench.contract_for(task, bench.TOY_FULL, data, cols, tmp_path / "o", arm=arm))
    free = bench.contract_for(bench.TOY_FULL.bitext, bench.TOY_FULL, data, cols, tmp_path / "o", arm="planner")
    assert free["training"]["steps"] == "auto"
    with pytest.raises(SystemExit):
        bench.main(["--toy", "--full", "--max-steps", "0", "--out", str(tmp_path / "x")])


def test_each_task_process_gets_the_arguments_but_jobs_and_out():
    bench = _bench()
    argv = ["--cpu", "--jobs", "2", "--out", "o", "--threads", "1", "--jobs=3", "--out=x", "--epsilons", "3", "8"]
    assert bench.child_argv(argv) == ["--cpu", "--threads", "1", "--epsilons", "3", "8"]


@needs_shared("data", "bitext_customer_support")
def test_study_validation_rows_are_neither_trained_nor_held_out(tmp_path):
    """Issue 43: the study's validation rows are the 200 training rows after the first N = 1,600 of --cpu; the
    trained jsonl keeps exactly 1,600 rows and none of them, nor any held-out row, is a validation row."""
    bench = _bench()
    path, held = bench.bitext_data(bench.CPU, tmp_path)
    trained = [json.loads(line) for line in path.read_text().splitlines()]
    val = bench.bitext_validation(bench.CPU, bench.STUDY_VALIDATION_ROWS)
    assert len(trained) == 1600 and len(val) == 200 and len(held) == 100

    def key(r):
        return json.dumps(r["messages"], sort_keys=True)

    assert not {key(r) for r in val} & {key(r) for r in trained}
    assert not {key(r) for r in val} & {key(r) for r in held}
    with pytest.raises(ValueError, match="max_train_rows"):
        bench.bitext_validation(bench.FULL, 10)


def test_study_levers_combine_and_refuse_conflicts(tmp_path):
    bench = _bench()
    task = bench.study_task(bench.CPU.bitext, ["ffa", "rank2"])
    assert (task.r, task.freeze_a, task.targets, task.epochs) == (2, True, ("q_proj", "v_proj"), 1.0)
    assert bench.study_task(bench.CPU.bitext, ["none"]) == bench.CPU.bitext
    with pytest.raises(ValueError, match="r twice"):
        bench.study_task(bench.CPU.bitext, ["rank2", "rank1-all"])
    e3 = bench.study_task(bench.CPU.bitext, ["epochs3-b32"])
    assert e3.epochs == 3.0 and bench.study_arm(["epochs3-b32"]) == "hand" and bench.study_arm(["ffa"]) == "planner"
    with pytest.raises(ValueError, match="does not combine"):
        bench.study_task(bench.CPU.bitext, ["epochs3-b32", "lr-x3"])
    assert bench.study_task(bench.CPU.bitext, ["lr-x3"]).lr == 0.006
    adambc = bench.study_task(bench.CPU.bitext, ["adambc", "epochs3", "lr-x3"])
    assert (adambc.optimizer, adambc.epochs, adambc.lr) == ("dp_adambc", 3.0, 0.006)
    data = tmp_path / "d.jsonl"
    data.write_text('{"p": "a"}\n')
    cols = {"prompt_column": "p"}
    raw = bench.contract_for(adambc, bench.CPU, data, cols, tmp_path / "o", arm="planner")
    assert raw["training"]["optimizer"] == "dp_adambc"
    assert "optimizer" not in bench.contract_for(bench.CPU.bitext, bench.CPU, data, cols, tmp_path / "o")["training"]
    norm = bench.study_task(bench.CPU.bitext, ["normalize", "clip-0.03"])
    privacy = bench.contract_for(norm, bench.CPU, data, cols, tmp_path / "o", arm="planner")["privacy"]
    assert (privacy["clipping"], privacy["max_grad_norm"]) == ("normalize", 0.03)
    assert "clipping" not in bench.contract_for(bench.CPU.bitext, bench.CPU, data, cols, tmp_path / "o")["privacy"]
    with pytest.raises(ValueError, match="clip twice"):
        bench.study_task(bench.CPU.bitext, ["clip-0.03", "clip-0.3"])
    with pytest.raises(ValueError, match="unknown lever"):
        bench.study_task(bench.CPU.bitext, ["rank3"])
    # the share is on the FIXED reference rows: today's DP row gives its documented 48.5 %
    assert bench.study_share(2.2804) == pytest.approx(0.485, abs=5e-4)
    assert bench.study_share(3.0793) == 0 and bench.study_share(1.4329) == pytest.approx(1.0)


@needs_shared("data", "bitext_customer_support")
def test_toy_study_trains_one_ffa_row_and_appends_it(tmp_path):
    """--study ffa --toy: one DP row at ε = 8 with A frozen; the row and the markdown table land in the given files,
    a second row is appended (the table replaced, the page's other text kept)."""
    from safetensors import safe_open

    bench = _bench()
    out, js, md = tmp_path / "s", tmp_path / "study.json", tmp_path / "page.md"
    md.write_text("# page\n\nkept text\n")
    row = bench.main(["--study", "ffa", "--toy", "--threads", "1", "--out", str(out), "--study-json", str(js),
                      "--study-md", str(md)])  # fmt: skip
    assert row["levers"] == ["ffa"] and row["lora"]["freeze_a"] is True and row["epsilon"] == 8.0
    assert 0 < row["epsilon_spent"] <= 8.0 and row["steps"] == 50 and row["sigma"] > 0
    folder = out / "runs" / "study-ffa"
    assert release_statement(folder)["predicate"]["lora"]["freeze_a"] is True
    with safe_open(str(folder / "adapter" / "adapter_model.safetensors"), framework="pt") as fh:
        b = sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys() if "lora_B" in k)
        a = sum(math.prod(fh.get_slice(k).get_shape()) for k in fh.keys() if "lora_A" in k)
    assert a > 0 and row["trained_parameters"] == b
    assert row["share_of_control_gain"] == pytest.approx((3.0793 - row["heldout_loss"]) / (3.0793 - 1.4329), abs=1e-4)
    assert row["validation_rows"] == 200 and math.isfinite(row["validation_loss"])
    assert row["base_validation_loss"] != row["validation_loss"]  # the adapter changed the model
    rows = json.loads(js.read_text())
    assert rows == [json.loads(json.dumps(row))]
    bench.write_study(row | {"levers": ["rank2"], "changes": ["LoRA r 2 on q,v"]}, js, md)
    text = md.read_text()
    assert len(json.loads(js.read_text())) == 2
    assert text.startswith("# page\n\nkept text\n") and text.count("## Study (issue 43)") == 1
    table = text.split(bench.STUDY_START)[1].split(bench.STUDY_END)[0]
    assert table.count("\n| ffa |") == 1 and table.count("\n| rank2 |") == 1 and "| reference |" in table


@needs_shared("data", "bitext_customer_support")
def test_toy_study_control_lever_trains_the_non_private_twin(tmp_path):
    """--study control --toy: the non-private control at its DP twin's planner B, T and lr (no noise, ε ∞),
    written to the table with ε spent ∞."""
    bench = _bench()
    out, js, md = tmp_path / "s", tmp_path / "study.json", tmp_path / "page.md"
    row = bench.main(["--study", "control", "--toy", "--threads", "1", "--out", str(out),
                      "--study-json", str(js), "--study-md", str(md)])  # fmt: skip
    dp = bench.main(["--study", "none", "--toy", "--threads", "1", "--out", str(tmp_path / "d"),
                     "--study-json", str(tmp_path / "d.json"), "--study-md", str(tmp_path / "d.md")])  # fmt: skip
    assert (row["batch"], row["steps"], row["lr"]) == (dp["batch"], dp["steps"], dp["lr"])
    statement = release_statement(out / "runs" / "study-control")
    assert statement["predicate"]["differentially_private"] is False
    assert row["epsilon_spent"] is None and row["sigma"] == 0.0 and row["batch"] > 0 and row["steps"] >= 50
    assert "| ∞ |" in md.read_text()


@needs_shared("data", "banking77")
def test_toy_study_on_banking77_scores_accuracy_on_test_and_validation_rows(tmp_path):
    """--study none --only banking77 --toy: one Banking77 DP row; accuracy on the reported test rows and on the unused
    test rows after them (validation), the share on the Banking77 reference, its own table in the page."""
    bench = _bench()
    out, js, md = tmp_path / "s", tmp_path / "study.json", tmp_path / "page.md"
    md.write_text("# page\n")
    row = bench.main(["--study", "none", "--only", "banking77", "--toy", "--threads", "1", "--out", str(out),
                      "--study-json", str(js), "--study-md", str(md)])  # fmt: skip
    assert row["task"] == "banking77" and 0 < row["epsilon_spent"] <= 8.0 and row["sigma"] > 0
    ref = bench.BANKING_STUDY_REFERENCE
    expected = (row["test_accuracy"] - ref["base"]) / (ref["control"] - ref["base"])
    assert row["share_of_control_gain"] == pytest.approx(expected, abs=1e-4)
    settings = bench.TOY_FULL
    per = settings.banking.eval_rows
    test = bench._read_csv(bench.BANKING / "test.csv")
    val = bench.banking_validation(settings, bench.STUDY_VALIDATION_PER_INTENT)
    reported = [r for label in settings.intents for r in [t for t in test if t["category"] == label][:per]]
    assert row["test_rows"] == len(reported) and row["validation_rows"] == len(val) > 0
    assert not {r["text"] for r in val} & {r["text"] for r in reported}  # validation is never a reported row
    text = md.read_text()
    assert bench.BANKING_STUDY_START in text and "## Study on Banking77 (issue 43)" in text
    assert "| none | today's row (r 8 on q,v, E 3) |" in text and bench.STUDY_START not in text
    # --rescore-banking77 scores the same release and base again: both scorings reproduce the row's numbers
    report = bench.main(["--rescore-banking77", str(out / "runs" / "study-banking77-none"), "--toy", "--threads", "1"])
    got = report[str(out / "runs" / "study-banking77-none")]
    assert (got["accuracy"], got["accuracy_per_token"]) == (row["test_accuracy"], row["test_accuracy_per_token"])
    assert report["base"]["accuracy"] == row["base_test_accuracy"]
    assert report["base"]["accuracy_per_token"] == row["base_test_accuracy_per_token"]
    assert sum(got["correct_by_intent"].values()) == round(row["test_accuracy"] * row["test_rows"])
    # the product's classification path (calibrated on the content-free input) scores the row and the rescore alike
    assert got["accuracy_calibrated"] == row["test_accuracy_calibrated"]
    assert report["base"]["accuracy_calibrated"] == row["base_test_accuracy_calibrated"]
    assert set(row["test_recall"]) == set(settings.intents)
    recalled = sum(row["test_recall"][label] * per for label in settings.intents)
    assert recalled == pytest.approx(row["test_accuracy_calibrated"] * row["test_rows"], abs=1e-3)
    assert not (out / "work").exists() or not any((out / "work").iterdir())  # the row's work folder is removed
    with pytest.raises(FileNotFoundError, match="no adapter"):
        bench.main(["--rescore-banking77", str(tmp_path), "--toy"])


def test_banking_eval_scores_summed_and_per_token_likelihoods():
    """A long label with the larger SUMMED NLL but the smaller MEAN per token: summed scoring picks the short label,
    per-token scoring the long one (the lost_or_stolen_card case of docs/utility.md)."""
    bench = _bench()

    class Scorer:
        def nll(self, model, table, contract, batch):  # records in (row, label) order: short, long
            assert [r["category"] for r in table] == ["short", "long", "short", "long"]
            return [2.0, 3.0, 1.0, 9.0], [2, 10, 2, 10]  # row 1: means 1.0 vs 0.3; row 2: 0.5 vs 0.9

    rows = [{"text": "a", "category": "long"}, {"text": "b", "category": "short"}]
    got = bench.banking_eval(Scorer(), None, rows, ["short", "long"], None, calibrate=False)
    assert (got["accuracy"], got["accuracy_per_token"]) == (0.5, 1.0)
    assert got["label_loss"] == pytest.approx((3.0 + 1.0) / 12)


@needs_shared("data", "bitext_customer_support")
def test_toy_study_at_epsilon_3_spends_at_most_3_and_says_so(tmp_path):
    """--study-epsilon 3: the row is planned and trained at target ε 3 (the ε = 3 confirmation of the study), spends
    close to but not over it, and its change line names the target; the share stays on the ε = 8 reference."""
    bench = _bench()
    out, js, md = tmp_path / "s", tmp_path / "study.json", tmp_path / "page.md"
    row = bench.main(["--study", "none", "--toy", "--threads", "1", "--out", str(out), "--study-epsilon", "3",
                      "--study-json", str(js), "--study-md", str(md)])  # fmt: skip
    assert row["epsilon"] == 3.0 and 2.5 < row["epsilon_spent"] <= 3.0
    assert row["changes"][-1] == "target ε 3 (not 8)"
    assert release_statement(out / "runs" / "study-none-eps3")["predicate"]["accounting"]["epsilon_spent"] <= 3.0
    assert row["share_of_control_gain"] == pytest.approx((3.0793 - row["heldout_loss"]) / (3.0793 - 1.4329), abs=1e-4)


@needs_shared("data", "twcs_customer_support_twitter")
@needs_shared("data", "bitext_customer_support")
@pytest.mark.parametrize("source", ["demo", "twcs"])
def test_toy_study_warm_start_levers_fit_a_public_corpus_first(tmp_path, source):
    """--study warm-demo / warm-twcs --toy: the row's release names the public file (another corpus than Bitext,
    issue 49), its sha256 and the settings the row records; ε spent is that of the same row without it (the plan
    does not change), and the public file is written as one-exchange conversations with the contract's column."""
    bench = _bench()
    out, js, md = tmp_path / "s", tmp_path / "study.json", tmp_path / "page.md"
    lever = f"warm-{source}"
    row = bench.main(["--study", lever, "--toy", "--threads", "1", "--out", str(out), "--study-json", str(js),
                      "--study-md", str(md)])  # fmt: skip
    warm = row["warm_start"]
    steps, batch, lr = bench.TOY_FULL.warm_start
    assert (warm["source"], warm["steps"], warm["batch_size"], warm["lr"]) == (source, steps, batch, lr)
    record = release_statement(out / "runs" / f"study-{lever}")["predicate"]
    entry = record["public_warm_start"]
    assert entry["sha256"] == warm["sha256"] and entry["file"] == f"warm_{source}.jsonl"
    assert (entry["steps"], entry["batch_size"], entry["lr"], entry["records"]) == (steps, batch, lr, warm["records"])
    assert 0 < row["epsilon_spent"] <= 8.0 and row["sigma"] > 0 and row["steps"] == 50
    none = bench.study_task(bench.TOY_FULL.bitext, ["none"])
    assert bench.study_task(bench.TOY_FULL.bitext, [lever]) == dataclasses.replace(none, warm_start=source)
    # the public file itself: the contract's messages column, user → assistant, never a Bitext row
    from dplora.contract.loader import parse_contract

    columns = {"record_format": "messages", "messages_column": "messages"}
    data = tmp_path / "d.jsonl"  # a stand-in training file: only its columns and row count are read here
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}))
    contract = parse_contract(bench.contract_for(none, bench.TOY_FULL, data, columns, tmp_path))
    path, count = bench.warm_start_file(source, bench.TOY_FULL, contract, tmp_path)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == warm["sha256"] and count == warm["records"]
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert all([t["role"] for t in r["messages"]] == ["user", "assistant"] for r in rows)
    bitext = {r["instruction"][:60] for r in bench._read_csv(bench.BITEXT)}
    assert not any(r["messages"][0]["content"] in bitext for r in rows)
    if source == "demo":
        assert count == steps * batch
    else:
        assert count == 2083  # every (customer tweet → brand reply) pair of the 5,000-row sample (SOURCE.md sha256)
    assert f"| {lever} |" in md.read_text()


@needs_shared("data", "banking77")
def test_a_killed_study_row_resumes_from_its_checkpoint(tmp_path):
    """A study row outlives a working session: stopped by SIGTERM after its first resume checkpoint, the same command
    resumes the run (same stable work folder, contract, data and ledger) instead of training it again, says so in
    the row, and its signed record accounts every step of both parts."""
    import os
    import signal
    import subprocess
    import time

    bench = _bench()
    out, js, md = tmp_path / "s", tmp_path / "study.json", tmp_path / "page.md"
    args = ["--study", "none", "--only", "banking77", "--toy", "--threads", "1", "--out", str(out),
            "--study-json", str(js), "--study-md", str(md)]  # fmt: skip
    checkpoint = out / "runs" / "study-banking77-none.partial" / "resume.safetensors"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "utility_bench.py"), *args], env=env, cwd=ROOT)
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert checkpoint.exists(), "no resume checkpoint appeared"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) != 0 and not js.exists()  # stopped: no row written
    assert (out / "work" / "study-banking77-none" / "ledger.sqlite3").exists()  # the row's state stays for the resume
    row = bench.main(args)
    assert row["resumed"].startswith("from a checkpoint") and 0 < row["epsilon_spent"] <= 8.0
    accounting = release_statement(out / "runs" / "study-banking77-none")["predicate"]["accounting"]
    assert accounting["epsilon_spent"] == pytest.approx(row["epsilon_spent"])  # the whole run, both parts, accounted
    assert not (out / "work" / "study-banking77-none").exists()
