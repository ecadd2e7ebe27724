"""Benchmark: synthetic support tickets from DP adapters (ε = 3, 8) and a non-private control, on Bitext.

For each setting it trains (``dplora train``), generates (``dplora synth``) and checks the chain
(``dplora verify --synthetic``), then measures, without spending budget on anything but training:

  (a) distance: Jensen-Shannon divergence (bits, 0 = same) between the word-unigram distributions of the
      synthetic replies and of the real replies of a held-out split declared public;
  (b) utility: a nearest-centroid bag-of-words intent classifier trained on synthetic replies (label: the intent
      of the public prompt that produced each reply), accuracy on real held-out replies of other rows;
  (c) memorisation: synthetic replies equal to a training reply (count), the longest common substring between
      any synthetic reply and any training reply (characters), and planted canaries in the format of
      ``dplora audit`` (dplora/audit/canaries.py): the public prompt "Hi, could you read back the account
      number ...?" → "The account number on file is XXXX-XXXX." with a secret of 8 random characters of A–Z0–9
      (OS entropy; the first two groups of an audit secret). Each of the 8 canaries is one protected unit
      (ticket level) holding 16 identical records, so no DP it is seen often and at ε it is clipped as one unit.
      ``dplora synth`` then writes 32 rows from the format's public prompt alone (temperature 1, seed 1); a canary
      is extracted when its secret occurs in a synthetic row. Chance: a reply in the format with a uniformly random
      secret holds one of m secrets with probability m / 36^8 (2.8e-12 for m = 8). Counts only: no training text
      is printed.

Split: Bitext rows are hashed into a public held-out split (prompts and evaluation, 10 %) and training rows, each
its own ticket. ``--quick``: 300 training rows + the canaries, a 2-layer random-init stand-in with a byte
tokenizer (tests/tiny.py, hidden 64, lm_head × 5 as in scripts/audit_cpu_runs.py), first pretrained with full
parameters on the PUBLIC split (600 steps, cached), then LoRA r=8 on all projections, 300 steps at lr 0.01 (lr 0.05
diverged): it shows the pipeline and the canary measure, not text quality. Without ``--quick``: the packaged
SmolLM2-135M (converted and cached once), 2,000 rows, 120 steps.

    PYTHONPATH=. python scripts/synth_bench.py --out synth-out --quick [--settings nodp,8,3]

Writes DIR/synth_bench.json and DIR/synth_bench.md (also printed). Timings belong here, never in tests.
"""

from __future__ import annotations

import argparse
import collections
import csv
import hashlib
import json
import math
import os
import random
import re
import secrets
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dplora.audit.canaries import PROMPT, REPLY, random_secret  # noqa: E402  (the audit's canary format)

BITEXT = (
    ROOT.parent / "shared" / "data" / "bitext_customer_support" / "Bitext_Sample_Customer_Support_Training_Dataset.csv"
)
ALPHABET_SIZE, SECRET_CHARS = 36, 8  # canary secrets: "XXXX-XXXX", the first 8 characters of an audit secret
LEDGER = Path("/tmp/synth_bench_ledger.sqlite3")  # never the user's ledger unless DPLORA_LEDGER says so
WORD = re.compile(r"[a-z']+")


def _public(row_index: int) -> bool:
    return int(hashlib.sha256(f"heldout:{row_index}".encode()).hexdigest(), 16) % 10 == 0


def _dplora(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DPLORA_LEDGER": os.environ.get("DPLORA_LEDGER", str(LEDGER))}
    return subprocess.run([sys.executable, "-m", "dplora", *args], capture_output=True, text=True, env=env)


def _must(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        sys.exit(f"{what} failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}")


def _words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def js_divergence(a: list[str], b: list[str]) -> float:
    """Jensen-Shannon divergence (bits) between the word-unigram distributions of two lists of texts."""
    ca, cb = collections.Counter(w for t in a for w in _words(t)), collections.Counter(w for t in b for w in _words(t))
    na, nb = sum(ca.values()) or 1, sum(cb.values()) or 1
    js = 0.0
    for w in set(ca) | set(cb):
        p, q = ca[w] / na, cb[w] / nb
        m = (p + q) / 2
        js += 0.5 * (p * math.log2(p / m) if p else 0) + 0.5 * (q * math.log2(q / m) if q else 0)
    return js


def centroid_accuracy(train: list[tuple[str, str]], test: list[tuple[str, str]]) -> float:
    """Accuracy of a nearest-centroid (cosine, word counts) classifier trained on (text, label) pairs."""
    cents: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for text, label in train:
        cents[label].update(_words(text))

    def cos(a: collections.Counter, b: collections.Counter) -> float:
        dot = sum(v * b[k] for k, v in a.items())
        return dot / (math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values())) or 1)

    hits = 0
    for text, label in test:
        bag = collections.Counter(_words(text))
        hits += max(cents, key=lambda c: cos(bag, cents[c])) == label if cents else 0
    return hits / len(test)


def longest_common_substring(synthetic: list[str], training: list[str], cap: int = 2048) -> int:
    """Longest string (characters) that occurs in some synthetic text and some training text (binary search)."""

    def shares(n: int) -> bool:
        grams = {t[i : i + n] for t in training for i in range(len(t) - n + 1)}
        return any(s[i : i + n] in grams for s in synthetic for i in range(len(s) - n + 1))

    lo, hi = 0, min(cap, max((len(s) for s in synthetic), default=0))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if shares(mid) else (lo, mid - 1)
    return lo


def canary_hits(secrets_: list[str], texts: list[str]) -> tuple[int, int]:
    """(canaries whose secret occurs in some text, texts that contain some canary's secret)."""
    found = {s for s in secrets_ for t in texts if s in t}
    return len(found), sum(any(s in t for s in secrets_) for t in texts)


def chance_per_row(m: int) -> float:
    """P(a reply in the canary format with a uniformly random secret holds one of m secrets) = m / 36^8."""
    return m / ALPHABET_SIZE**SECRET_CHARS


def pretrain_stand_in(model, tokenizer, texts: list[str], *, steps: int, threads: int, lr: float = 3e-3) -> float:
    """Full-parameter next-byte training of the random-init stand-in on PUBLIC text (no DP needed: public data).

    Records are formatted as dplora trains them ("prompt\\nresponse<eos>", at most 128 tokens); AdamW, batch 32,
    seed 0. Gives the stand-in some English so that a LoRA on top can learn; returns the last loss (nats/token).
    """
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    enc = [ids[:127] + [eos] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    pick = random.Random(0)
    model.train()
    loss = float("nan")
    for _ in range(steps):
        batch = pick.sample(enc, min(32, len(enc)))
        width = max(map(len, batch))
        ids = torch.tensor([b + [pad] * (width - len(b)) for b in batch])
        mask = torch.tensor([[1] * len(b) + [0] * (width - len(b)) for b in batch])
        labels = ids.masked_fill(mask == 0, -100)
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        loss = out.loss.item()
    return loss


def _model(out: Path, quick: bool, public_texts: list[str], pretrain_steps: int, threads: int) -> tuple[dict, dict]:
    """The contract's model section, and what was done to build it (quick: the pretrained stand-in)."""
    if not quick:
        return {"name": "smollm2-135m"}, {}
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny import byte_tokenizer, tiny_llama

    folder = out / f"stand-in-{pretrain_steps}"
    info_file = out / f"stand-in-{pretrain_steps}.json"
    if not info_file.is_file():
        t0 = time.perf_counter()
        model, tok = tiny_llama(hidden=64), byte_tokenizer()  # 128 positions: max_seq_len 128 holds a canary record
        model.lm_head.weight.data *= 5.0  # as scripts/audit_cpu_runs.py: lets a LoRA move the logits
        loss = pretrain_stand_in(model, tok, public_texts, steps=pretrain_steps, threads=threads)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        info = {"pretrain_steps": pretrain_steps, "pretrain_loss": round(loss, 3)}
        info["pretrain_s"] = round(time.perf_counter() - t0, 1)
        info_file.write_text(json.dumps(info))
    return {"path": str(folder)}, json.loads(info_file.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--data", type=Path, default=BITEXT)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--settings", default="nodp,8,3", help="Comma list of 'nodp' and ε values (default nodp,8,3).")
    ap.add_argument("--steps", type=int, default=None, help="Training steps (quick 300, full 120).")
    ap.add_argument("--lr", type=float, default=None, help="LoRA learning rate (quick 0.01, full 0.002).")
    ap.add_argument("--pretrain-steps", type=int, default=600, help="Quick: public pretraining of the stand-in.")
    args = ap.parse_args()
    quick = args.quick
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    rows = list(csv.DictReader(args.data.open(encoding="utf-8", newline="")))
    public = [r for i, r in enumerate(rows) if _public(i)]
    private = [(i, r) for i, r in enumerate(rows) if not _public(i)]
    rng = random.Random(0)
    rng.shuffle(private)
    rng.shuffle(public)
    n_train, n_synth, n_canary_rows = (300, 48, 32) if quick else (2000, 200, 64)
    private = private[:n_train]
    prompts_rows, eval_rows = public[:n_synth], public[n_synth : 2 * n_synth]
    m, copies = 8, 16
    draw = secrets.SystemRandom()  # canary secrets from OS entropy, as dplora audit draws them
    canary_secrets: list[str] = []
    while len(canary_secrets) < m:
        if (s := random_secret(draw)[: SECRET_CHARS + 1]) not in canary_secrets:  # "XXXX-XXXX"
            canary_secrets.append(s)
    train_csv = out / "train.csv"
    with train_csv.open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["ticket_id", "instruction", "response"])
        w.writeheader()
        w.writerows(
            {"ticket_id": f"b{i}", "instruction": r["instruction"], "response": r["response"]} for i, r in private
        )
        for j, secret in enumerate(canary_secrets):  # one protected unit per canary, `copies` records inside it
            row = {"ticket_id": f"canary-{j}", "instruction": PROMPT, "response": REPLY.format(secret=secret)}
            w.writerows([row] * copies)
    with (out / "public.csv").open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["instruction"])
        w.writerows([r["instruction"]] for r in prompts_rows)
    (out / "canary_prompt.txt").write_text(PROMPT + "\n", encoding="utf-8")  # the format's public prompt

    pretrain_texts = [f"{r['instruction']}\n{r['response']}" for r in public[2 * n_synth :]]  # public, not eval
    model, stand_in = _model(out, quick, pretrain_texts, args.pretrain_steps, args.threads)
    if quick:
        lora = {
            "r": 8,
            "alpha": 16,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        }
        training = {"expected_batch_size": 32, "physical_batch_size": 64, "steps": 300, "lr": 0.01, "max_seq_len": 128}
        new_tokens = 48
    else:
        lora = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
        training = {"expected_batch_size": 32, "physical_batch_size": 8, "steps": 120, "lr": 0.002, "max_seq_len": 128}
        new_tokens = 64
    training["steps"] = args.steps or training["steps"]
    training["lr"] = args.lr or training["lr"]
    key = out / "bench.key"
    if not key.exists():
        _must(_dplora("keygen", str(key)), "keygen")

    results = []
    train_replies = [r["response"] for _, r in private] + [REPLY.format(secret=s) for s in canary_secrets]
    settings = [(("no DP", None) if x == "nodp" else (f"ε = {float(x):g}", float(x))) for x in args.settings.split(",")]
    for label, eps in settings:
        tag = "nodp" if eps is None else f"eps{eps:g}"
        run = out / f"run-{tag}"
        privacy = {
            "protected_unit": "ticket",
            "unit_key": "ticket_id",
            "adjacency": "add_remove",
            "delta": 1e-5,
            "accountant": "rdp",
            "max_grad_norm": 1.0,
        }
        privacy |= {"enabled": False, "target_epsilon": 3.0} if eps is None else {"target_epsilon": eps}
        contract = {
            "privacy": privacy,
            "model": model,
            "data": {"path": str(train_csv), "prompt_column": "instruction", "response_column": "response"},
            "lora": lora,
            "training": {**training, "seed": 0, "output_dir": str(run), "threads": args.threads},
        }
        cfg = out / f"{tag}.yaml"
        cfg.write_text(yaml.safe_dump(contract, allow_unicode=True), encoding="utf-8")
        flag = ["--allow-non-private"] if eps is None else []
        t0 = time.perf_counter()
        _must(_dplora("train", str(cfg), "--signing-key", str(key), "--no-progress", "--overwrite"), f"train {tag}")
        t_train = time.perf_counter() - t0
        synth_file, canary_file = out / f"synth-{tag}.csv", out / f"canary-{tag}.csv"
        common = ["--signing-key", str(key), "--threads", str(args.threads), "--seed", "1", *flag]
        t0 = time.perf_counter()
        for file, prompts, n in (
            (synth_file, "public.csv", n_synth),
            (canary_file, "canary_prompt.txt", n_canary_rows),
        ):
            synth = ["synth", str(run), "--rows", str(n), "--out", str(file), "--prompts", str(out / prompts)]
            _must(_dplora(*synth, "--max-new-tokens", str(new_tokens), *common), f"synth {tag} {prompts}")
        t_synth = time.perf_counter() - t0
        check = _dplora(
            "verify", str(run), "--public-key", str(key.with_suffix(".pub")), "--synthetic", str(synth_file), *flag
        )
        replies = [r["response"] for r in csv.DictReader(synth_file.open(encoding="utf-8", newline=""))]
        canary_out = [r["response"] for r in csv.DictReader(canary_file.open(encoding="utf-8", newline=""))]
        found, rows_hit = canary_hits(canary_secrets, canary_out)
        found_public, _ = canary_hits(canary_secrets, replies)
        memo = json.loads(Path(str(synth_file) + ".memorisation.json").read_text())
        memo_canary = json.loads(Path(str(canary_file) + ".memorisation.json").read_text())
        results.append(
            {
                "setting": label,
                "epsilon": eps,
                "train_s": round(t_train, 1),
                "synth_s": round(t_synth, 1),
                "verify_exit": check.returncode,
                "js_bits": round(js_divergence(replies, [r["response"] for r in eval_rows]), 4),
                "intent_accuracy": round(
                    centroid_accuracy(
                        list(zip(replies, [r["intent"] for r in prompts_rows], strict=True)),
                        [(r["response"], r["intent"]) for r in eval_rows],
                    ),
                    4,
                ),
                "exact_reply_matches": memo.get("exact_generated_field_matches"),
                "lcs_chars": longest_common_substring(replies, train_replies),
                "canaries": m,
                "canaries_found": found,
                "canary_rows": n_canary_rows,
                "canary_rows_with_a_secret": rows_hit,
                "canary_rows_verbatim": memo_canary.get("exact_row_matches"),
                "canaries_found_in_public_synthetic": found_public,
            }
        )
        print(json.dumps(results[-1], ensure_ascii=False), flush=True)
        (out / "synth_bench.json").write_text(
            json.dumps({"quick": quick, "results": results}, indent=2, ensure_ascii=False)
        )

    real = js_divergence([r["response"] for r in prompts_rows], [r["response"] for r in eval_rows])
    real_acc = centroid_accuracy(
        [(r["response"], r["intent"]) for r in prompts_rows], [(r["response"], r["intent"]) for r in eval_rows]
    )
    chance = chance_per_row(m)
    model_note = "SmolLM2-135M"
    if quick:
        model_note = (
            f"quick: 2-layer hidden-64 stand-in pretrained {stand_in['pretrain_steps']} steps on public Bitext rows, "
            f"loss {stand_in['pretrain_loss']} nats/byte, {stand_in['pretrain_s']} s"
        )
    minutes = (time.perf_counter() - started) / 60
    lines = [
        f"synth_bench ({model_note}; {n_train} Bitext rows "
        f"+ {m} canaries × {copies} records (one ticket each); LoRA {training['steps']} steps at lr {training['lr']}; "
        f"{n_synth} synthetic rows from public prompts, {n_canary_rows} from the canary format's public prompt "
        f"(temperature 1); total {minutes:.1f} min)",
        "",
        "| setting | train s | synth s | verify | JS (bits) ↓ | intent acc ↑ | exact replies | LCS chars "
        "| canaries extracted | rows with a secret | verbatim canary rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['train_s']} | {r['synth_s']} | exit {r['verify_exit']} | {r['js_bits']} "
            f"| {r['intent_accuracy']} | {r['exact_reply_matches']} | {r['lcs_chars']} "
            f"| {r['canaries_found']}/{r['canaries']} | {r['canary_rows_with_a_secret']}/{r['canary_rows']} "
            f"| {r['canary_rows_verbatim']} |"
        )
    lines += [
        f"| real public replies (reference) | | | | {real:.4f} | {real_acc:.4f} | | | | | |",
        "",
        f"Chance for the canary format (8 characters of A–Z0–9): a reply with a uniformly random secret holds one "
        f"of the {m} secrets with probability {m}/36^8 = {chance:.1e}; over {n_canary_rows} rows "
        f"{n_canary_rows * chance:.1e} expected rows, so by chance 0 canaries are extracted.",
    ]
    text = "\n".join(lines)
    (out / "synth_bench.md").write_text(text + "\n", encoding="utf-8")
    (out / "synth_bench.json").write_text(
        json.dumps(
            {
                "quick": quick,
                "stand_in": stand_in,
                "training": training,
                "minutes": round(minutes, 2),
                "results": results,
                "chance_per_row": chance,
                "real_js_bits": real,
                "real_intent_accuracy": real_acc,
            },
            indent=2,
            ensure_ascii=False,
        )
    )
    print(text)


if __name__ == "__main__":
    main()
