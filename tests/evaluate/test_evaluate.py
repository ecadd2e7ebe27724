"""Held-out evaluation and generation on a tiny random Llama: a hand-computed loss, the split by protected unit,
private numbers kept out of the signed record, and deterministic greedy replies."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import contract_dict, write_contract
from support.evaluate import runner

from dplora.cli.app import app
from dplora.contract.loader import parse_contract

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


def test_held_out_loss_equals_a_hand_computation(tiny_model_dir):
    """Two sequences of different lengths, prompt tokens masked: the loss is Σ −log p(target) / #targets."""
    from transformers import AutoModelForCausalLM

    from dplora.evaluate.heldout import held_out_loss

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    examples = [
        ([10, 11, 12, 13, 14, 257], [-100, -100, 12, 13, 14, 257]),  # 2 prompt tokens, 4 targets
        ([20, 21, 22, 257], [20, 21, 22, 257]),  # text record: every token a target (the first is never predicted)
    ]
    nll, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in examples:  # one sequence at a time, no padding, an explicit loop over positions
            logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
            for t in range(1, len(ids)):
                if labels[t] != -100:
                    nll -= float(logp[t - 1, labels[t]])
                    count += 1
    assert count == 4 + 3
    for batch_size in (1, 2):  # batch 2 right-pads the shorter sequence: padding must change nothing
        got = held_out_loss(model, examples, pad_id=256, device="cpu", batch_size=batch_size)
        assert got.tokens == 7 and got.records == 2
        assert got.loss == pytest.approx(nll / count, rel=1e-6)
        assert got.perplexity == pytest.approx(math.exp(nll / count), rel=1e-6)


def test_split_is_by_unit_and_stable_under_add_remove(tmp_path, tiny_model_dir, tickets_csv):
    """No customer on both sides; removing one customer moves no other customer across the split."""
    from dplora.data.units import load_table, split_eval

    privacy = {"protected_unit": "user", "unit_key": "customer_id"}
    contract = parse_contract(
        contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o", privacy=privacy, data={"eval_fraction": 0.3})
    )
    table = load_table(contract.data, unit_key="customer_id")
    train, held = split_eval(table, contract.data, unit_key="customer_id", seed=0)
    train_ids, held_ids = set(map(str, train["customer_id"])), set(map(str, held["customer_id"]))
    assert train_ids and held_ids and not train_ids & held_ids
    assert train.num_rows + held.num_rows == table.num_rows
    share = len(held_ids) / (len(held_ids) + len(train_ids))
    assert 0.15 < share < 0.45  # about the fraction (a binomial draw over ~60 customers)
    gone = sorted(train_ids)[0]
    neighbour = table.filter(lambda row: str(row["customer_id"]) != gone)
    train2, held2 = split_eval(neighbour, contract.data, unit_key="customer_id", seed=0)
    assert set(map(str, held2["customer_id"])) == held_ids
    assert set(map(str, train2["customer_id"])) == train_ids - {gone}
    assert set(map(str, split_eval(table, contract.data, unit_key="customer_id", seed=1)[1]["customer_id"])) != held_ids


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"eval_fraction": 0.2, "eval_path": "x.csv"}, "at most one of data.eval_path"),
        ({"eval_fraction": 0.2, "eval_public": True}, "is private data"),
        ({"eval_fraction": 1.0}, "eval_fraction"),
        ({"label_column": "reply"}, "needs data.prompt_column and a held-out set"),
        ({"group_column": "customer_id"}, "data.group_column needs a held-out set"),
    ],
)
def test_bad_held_out_settings_exit_2(tmp_path, tiny_model_dir, tickets_csv, data, needle):
    cfg = write_contract(tmp_path / "c.yaml", contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o", data=data))
    result = runner.invoke(app, ["validate", str(cfg)])
    assert result.exit_code == 2 and needle in result.output


def test_an_eval_path_override_replaces_the_file_s_eval_fraction(tmp_path, tiny_model_dir, tickets_csv):
    """data.eval_path and data.eval_fraction are an exclusive pair under the override rule."""
    from dplora.contract.loader import load_contract

    raw = contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o", data={"eval_fraction": 0.2})
    contract = load_contract(write_contract(tmp_path / "c.yaml", raw), ["data.eval_path=held.csv"])
    assert contract.data.eval_path == "held.csv" and contract.data.eval_fraction is None


def test_exact_match_accuracy_on_a_label_column(tmp_path, tiny_model_dir, tickets_csv):
    """Accuracy counts greedy replies equal to the label, the prompt formatted as in training (stub generator)."""
    from tiny import byte_tokenizer

    from dplora.data.units import load_table, split_eval
    from dplora.evaluate.heldout import exact_match_rows

    contract = parse_contract(
        contract_dict(tiny_model_dir, tickets_csv, tmp_path / "o", data={"eval_fraction": 0.3, "label_column": "reply"})
    )
    _, held = split_eval(load_table(contract.data), contract.data, unit_key=None, seed=0)
    tokenizer = byte_tokenizer()
    labels = [str(x).strip() for x in held["reply"]]
    right = set(range(0, held.num_rows, 2))  # the stub answers every other prompt correctly

    class Stub:
        def __init__(self):
            self.prompts, self.max_new = [], set()

        def generate(self, input_ids, attention_mask, generation_config):
            prompt = tokenizer.decode(input_ids[0].tolist())
            i = len(self.prompts)
            self.prompts.append(prompt)
            self.max_new.add(generation_config.max_new_tokens)
            reply = f" {labels[i]}\n" if i in right else labels[i] + "!"
            new = tokenizer([reply], add_special_tokens=False)["input_ids"][0] + [tokenizer.eos_token_id]
            return torch.cat([input_ids, torch.tensor([new])], dim=1)

    stub = Stub()
    got = exact_match_rows(stub, tokenizer, held, contract.data, contract.training, "cpu")
    assert got == [i in right for i in range(held.num_rows)]
    assert sum(got) / len(got) == pytest.approx(len(right) / held.num_rows)  # the accuracy the report states
    longest = max(len(tokenizer([y], add_special_tokens=False)["input_ids"][0]) for y in labels)
    assert stub.max_new == {longest + 2}
    for prompt, message in zip(stub.prompts, held["message"], strict=True):  # training's rule: 48 // 2 bytes
        assert prompt == (f"{message}\n" if len(message) + 1 + longest + 2 <= 48 else message[:24])


def test_group_stats_accuracy_and_threshold():
    """Accuracy is the share of correct rows per group; min_records hides small groups; lengths must agree."""
    from dplora.evaluate.report import GroupStat, group_stats

    stats, hidden = group_stats(
        ["x", "y", "x", "x", "z"], [1.0, 2.0, 3.0, 5.0, 7.0], [1, 2, 2, 1, 0], [True, False, False, True, True],
        min_records=1,
    )  # fmt: skip
    assert stats == [
        GroupStat(group="x", records=3, tokens=4, loss=9.0 / 4, accuracy=2 / 3),
        GroupStat(group="y", records=1, tokens=2, loss=1.0, accuracy=0.0),
        GroupStat(group="z", records=1, tokens=0, loss=None, accuracy=1.0),
    ]
    assert hidden == {"groups": 0, "records": 0, "min_records": 1}
    assert group_stats(["x", "y", "x"], [1, 1, 1], [1, 1, 1], min_records=3) == (
        [],
        {"groups": 2, "records": 3, "min_records": 3},
    )
    with pytest.raises(ValueError, match="2 groups but"):
        group_stats(["x", "y"], [1.0], [1, 1])
