"""scripts/token_lengths.py (issue 31): whole-conversation token counts through a tokenizer's own chat template,
nearest-rank percentiles, and the suggested max_seq_len (p95 of Bitext and demo, rounded up to 64), on tiny data
and the tests' byte-level ChatML tokenizer (one token per byte plus the markers)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

from tiny import CHATML, chat_tokenizer

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import token_lengths  # noqa: E402

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_lengths_count_the_rendered_conversation_and_percentiles_are_nearest_rank():
    tok = chat_tokenizer(CHATML)
    conv = [{"role": "user", "content": "abc"}, {"role": "assistant", "content": "de"}]
    text = SYSTEM + "<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\nde<|im_end|>\n"
    # one token per byte, each of the 3 <|im_start|> (12 bytes) and 3 <|im_end|> (10 bytes) markers one token
    expected = len(text.encode()) - 3 * (12 - 1) - 3 * (10 - 1)
    assert expected == 104
    assert token_lengths.lengths(tok, [conv]) == [expected]
    values = list(range(1, 101))
    assert [token_lengths.nearest_rank(values, q) for q in (0.5, 0.9, 0.95, 0.99, 1.0)] == [50, 90, 95, 99, 100]
    assert token_lengths.nearest_rank([7], 0.95) == 7


def test_the_script_prints_the_table_and_a_multiple_of_64(tmp_path):
    model = tmp_path / "tok"
    chat_tokenizer(CHATML).save_pretrained(model)
    shared = tmp_path / "data"
    (shared / "bitext_customer_support").mkdir(parents=True)
    with open(shared / "bitext_customer_support" / "Bitext_Sample_Customer_Support_Training_Dataset.csv", "w") as fh:
        writer = csv.DictWriter(fh, fieldnames=["instruction", "response"])
        writer.writeheader()
        writer.writerows({"instruction": "q" * i, "response": "r" * i} for i in range(1, 21))
    (shared / "twcs_customer_support_twitter").mkdir()
    (shared / "twcs_customer_support_twitter" / "twcs_first5000.csv").write_text(
        ",tweet_id,author_id,inbound,created_at,text,response_tweet_id,in_response_to_tweet_id\n"
        "0,1,111,True,Tue Oct 31 22:10:47 +0000 2017,hello,2,\n"
        "1,2,Brand,False,Tue Oct 31 22:11:47 +0000 2017,hi there,,1.0\n",
        encoding="utf-8",
    )
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "token_lengths.py"),
            "--shared",
            str(shared),
            "--tokenizer",
            str(model),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    bitext, twcs = doc["tokens"]["bitext (1 turn)"], doc["tokens"]["twcs conversations"]
    assert bitext["records"] == 20 and twcs["records"] == 1 and doc["tokens"]["demo conversations"]["records"] == 1000
    assert bitext["max"] - bitext["p50"] == 2 * (20 - 10)  # one byte-token per character of each field
    p95 = max(bitext["p95"], doc["tokens"]["demo conversations"]["p95"])
    assert doc["suggested_max_seq_len"] % 64 == 0 and 0 <= doc["suggested_max_seq_len"] - p95 < 64
    assert "hello" not in out.stdout  # lengths only, never text
