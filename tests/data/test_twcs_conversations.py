"""Issue 31: `prepare-twcs --conversations`: one multi-turn conversation per reply thread at customer level. A thread
that mixes two customers (their texts carry unique markers) never puts one customer's text or id into the other's
record; roles alternate (user first, assistant last); the first-reply mode is unchanged. Real-file assertions
report counts only (the tweets are real, CC BY-NC-SA)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.data.twcs import load_twcs_conversations, load_twcs_pairs, write_twcs_conversations
from dplora.data.twcs_tweets import BrandRule
from dplora.errors import BadInputError

runner = CliRunner()


RULE = BrandRule(frozenset({"brand"}))  # the red-team inputs name customers A, B, C: the one brand is listed


HEADER = ",tweet_id,author_id,inbound,created_at,text,response_tweet_id,in_response_to_tweet_id\n"


def _csv(path: Path, tweets: list[tuple]) -> Path:
    """tweets: (tweet_id, author, inbound, minute, text, parent or '')."""
    lines = [
        f'{i},{tid},{author},{inbound},Tue Oct 31 22:{minute:02d}:00 +0000 2017,"{text}",,{parent}\n'
        for i, (tid, author, inbound, minute, text, parent) in enumerate(tweets)
    ]
    path.write_text(HEADER + "".join(lines), encoding="utf-8")
    return path


MIXED = [  # customer 111 (markers AAA*) opens a thread that customer 222 (markers BBB*) joins
    (1, 111, True, 0, "@Brand AAA1 my parcel is lost", ""),
    (2, 111, True, 1, "AAA2 order 55", "1.0"),  # a second customer tweet before the reply: merged into one turn
    (3, "Brand", False, 2, "@111 sorry AAA, DM us", "2.0"),
    (4, 222, True, 3, "@Brand @111 BBB1 mine too, order 77", "3.0"),  # another customer: dropped
    (5, "Brand", False, 4, "@222 BBB2 order 77 is on its way", "4.0"),  # answers the dropped turn: dropped
    (6, 111, True, 5, "@Brand AAA3 thanks, also see @222", "3.0"),  # 222's id is redacted
    (7, "Brand", False, 6, "@111 @222 glad to help AAA", "6.0"),  # 222's id is redacted
    (8, 111, True, 7, "@Brand AAA4 bye", "7.0"),  # a trailing user turn: cut
    (9, 222, True, 10, "@Brand BBB3 my own thread", ""),
    (10, "Brand", False, 11, "@222 BBB4 we are on it", "9.0"),
    (11, 333, True, 12, "@Brand CCC1 hello", ""),  # only another customer answers: the thread is dropped
    (12, 444, True, 13, "@333 DDD1 same here", "11.0"),
    (13, "Brand", False, 14, "@444 DDD2 sorry", "12.0"),
]


def test_no_record_of_one_customer_holds_another_customers_text_or_id(tmp_path):
    stats = Counter()
    rows = load_twcs_conversations(_csv(tmp_path / "mixed.csv", MIXED), stats)
    by_customer = {r["customer_id"]: r for r in rows}
    assert sorted(by_customer) == ["111", "222"]  # 333's thread has no brand reply to 333: dropped
    a, b = json.dumps(by_customer["111"]), json.dumps(by_customer["222"])
    assert "BBB" not in a and "222" not in a and "DDD" not in a
    assert "AAA" not in b and "111" not in b
    assert by_customer["111"]["messages"] == [
        {"role": "user", "content": "@Brand AAA1 my parcel is lost\nAAA2 order 55"},
        {"role": "assistant", "content": "@111 sorry AAA, DM us"},
        {"role": "user", "content": "@Brand AAA3 thanks, also see @customer"},
        {"role": "assistant", "content": "@111 @customer glad to help AAA"},
    ]
    assert by_customer["111"]["tweet_id"] == "1"
    assert by_customer["222"]["messages"] == [
        {"role": "user", "content": "@Brand BBB3 my own thread"},
        {"role": "assistant", "content": "@222 BBB4 we are on it"},
    ]
    assert stats["threads"] == 3 and stats["conversations"] == 2
    assert stats["turns_dropped_by_rule"] == 4  # tweets 4, 5 (answer to 4), 12 and 13 (answer to 12)
    assert stats["threads_dropped_by_rule"] == 1 and stats["mentions_redacted"] == 2


def test_cli_conversations_write_jsonl_and_the_pair_mode_is_unchanged(tmp_path):
    src = _csv(tmp_path / "mixed.csv", MIXED)
    dest = tmp_path / "conv.jsonl"
    result = runner.invoke(app, ["prepare-twcs", str(src), str(dest), "--conversations", "--show-private"])
    assert result.exit_code == 0, result.output
    assert "wrote 2 conversations from 2 customers" in result.output and "AAA" not in result.output
    rows = [json.loads(line) for line in dest.read_text(encoding="utf-8").splitlines()]
    assert [list(r) for r in rows] == [["customer_id", "tweet_id", "messages"]] * 2
    refused = runner.invoke(app, ["prepare-twcs", str(src), str(tmp_path / "conv.csv"), "--conversations"])
    assert refused.exit_code == 2 and not (tmp_path / "conv.csv").exists()
    pairs = runner.invoke(app, ["prepare-twcs", str(src), str(tmp_path / "pairs.jsonl")])
    assert pairs.exit_code == 0, pairs.output
    written = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert written == load_twcs_pairs(src)  # first-reply pairs: every customer tweet with its first brand reply
    assert [(p["customer_id"], p["tweet_id"], p["reply"]) for p in written] == [
        ("111", "2", "@111 sorry AAA, DM us"),
        ("222", "4", "@222 BBB2 order 77 is on its way"),
        ("111", "6", "@111 @customer glad to help AAA"),  # redacted as conversations are (issue 41)
        ("222", "9", "@222 BBB4 we are on it"),
        ("444", "12", "@444 DDD2 sorry"),
    ]
    with pytest.raises(BadInputError, match="exists"):
        write_twcs_conversations(src, dest)


# Red-team findings on the first version (issue 31): each input put one customer's text or id into another's record.
def _by_customer(tmp_path, tweets):
    return {
        r["customer_id"]: json.dumps(r) for r in load_twcs_conversations(_csv(tmp_path / "t.csv", tweets), brands=RULE)
    }


@pytest.mark.parametrize("flag", ["true", "TRUE", "1", "yes", ""])
def test_an_inbound_flag_other_than_true_or_false_is_refused(tmp_path, flag):
    tweets = [(1, "A", True, 0, "A asks", ""), (2, "Brand", False, 1, "@A hi", "1.0"), (3, "B", flag, 2, "BBB", "2.0")]
    if flag.lower() == "true":
        rows = _by_customer(tmp_path, tweets)  # read as inbound: B's tweet in A's thread is dropped
        assert "BBB" not in rows["A"]
        return
    with pytest.raises(BadInputError, match=r"data row 3: inbound must be True or False"):
        load_twcs_conversations(_csv(tmp_path / "t.csv", tweets), brands=RULE)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((3, "B", False, 2, "BBB secret in A thread", "2.0"), "tweet_id 3: outbound, but its author is a customer"),
        ((3, "Brand", True, 2, "BBB", ""), "tweet_id 3: inbound, but its author is a brand"),  # a lying flag
        ((3, "b", True, 2, "BBB", ""), "differs from another author's only in case"),
        ((3, " ", True, 2, "BBB", "2.0"), "author_id is empty"),
        ((3, "C", True, 2, "BBB", "1.9"), "not a whole tweet id"),
        ((9007199254740993, "C", True, 2, "BBB", "9007199254740992.0"), "not a whole tweet id|"),
    ],
)
def test_authors_and_ids_dplora_cannot_classify_are_refused(tmp_path, extra, message):
    base = [(1, "A", True, 0, "A asks", ""), (2, "Brand", False, 1, "@A hi", "1.0"), (10, "B", True, 5, "B", "")]
    if not message.endswith("|"):
        with pytest.raises(BadInputError, match=message):
            load_twcs_conversations(_csv(tmp_path / "t.csv", [*base, extra]), brands=RULE)
        return
    # above 2**53: ids stay exact, so a reply to 9007199254740992 is not attached to tweet 9007199254740993
    rows = _by_customer(
        tmp_path,
        [
            (9007199254740993, "A", True, 0, "AAA", ""),
            (2, "Brand", False, 1, "@A hi", "9007199254740993.0"),
            (9007199254740992, "C", True, 2, "CCC", ""),
        ],
    )
    assert "AAA" in rows["A"] and "C" not in rows


@pytest.mark.parametrize(
    "row_b",
    [
        '5,5,222,True,Tue Oct 31 22:00:00 +0000 2017,"BBB1 opens\n',
        '5,5,222,True,Tue Oct 31 22:00:00 +0000 2017,"BBB1 opens\n'
        '0,1,111,True,Tue Oct 31 22:01:00 +0000 2017,AAA private,,\nBBB ends",,\n',
    ],
)
def test_a_quote_that_swallows_other_rows_is_refused(tmp_path, row_b):
    rows = (
        "0,1,111,True,Tue Oct 31 22:01:00 +0000 2017,AAA private,,\n"
        "9,8,Brand,False,Tue Oct 31 22:02:00 +0000 2017,@222 hi,,5.0\n"
    )
    path = tmp_path / "t.csv"
    path.write_text(HEADER + row_b + rows, encoding="utf-8")
    with pytest.raises(BadInputError, match="malformed csv|shaped like a TWCS row|fields, not"):
        load_twcs_conversations(path, brands=RULE)


def test_a_repeated_tweet_id_is_refused(tmp_path):
    tweets = [
        (1, "A", True, 5, "A SSN 123", ""),
        (2, "Brand", False, 6, "@A we see 123", "1.0"),
        (1, "B", True, 0, "B", ""),
    ]
    with pytest.raises(BadInputError, match=r"data row 3: tweet_id repeats an earlier row's"):
        load_twcs_conversations(_csv(tmp_path / "t.csv", tweets), brands=RULE)


def test_a_record_does_not_depend_on_whether_the_mentioned_customer_is_in_the_file(tmp_path):
    thread = [(1, "A", True, 0, "my friend @B has card 4444", ""), (2, "Brand", False, 1, "@A @B sorry", "1.0")]
    without_b = _by_customer(tmp_path, thread)["A"]
    with_b = _by_customer(
        tmp_path, [*thread, (10, "B", True, 5, "B asks", ""), (11, "Brand", False, 6, "@B hi", "10.0")]
    )["A"]
    assert without_b == with_b and "@B" not in with_b and "@customer sorry" in with_b and "@A" in with_b


def test_mention_forms_are_redacted_but_the_brand_and_the_customer_stay(tmp_path):
    rows = _by_customer(
        tmp_path,
        [
            (1, "A", True, 0, "@Brand help", ""),
            (2, "Brand", False, 1, "@a @brand \uff20B \ufe6bB @\u200bB @b @B_ @B's @B-x &#64;B", "1.0"),
        ],
    )
    reply = json.loads(rows["A"])["messages"][1]["content"]
    assert reply == "@a @brand @customer @customer @customer @customer @customer @customer's @customer @customer"


def test_a_crlf_file_is_read(tmp_path):
    path = _csv(tmp_path / "t.csv", [(1, "A", True, 0, "A asks", ""), (2, "Brand", False, 1, "@A hi", "1.0")])
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    rows = load_twcs_conversations(path, brands=RULE)
    assert [m["content"] for m in rows[0]["messages"]] == ["A asks", "@A hi"]
