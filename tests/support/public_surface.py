"""Helpers shared by test_public_surface.py and the tests that build on it."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import re
from datetime import datetime
from pathlib import Path

import yaml
from conftest import contract_base
from typer.testing import CliRunner

from dplora.cli.app import app

INPUTS = ("contract.yaml", "prompts.txt")


NOT_PUBLIC = ("data.", "ledger.sqlite3", "cache", "twcs.csv")  # prefixes: ledger.sqlite3-wal, -shm too


ESTIMATE_TIMES = re.compile(
    r"(estimate: about )[^()]*?( for \d+ steps \()[\d.e+-]+( s/step: \d+ forward\(s\) of \d+ synthetic records × \d+ "
    r"tokens at )[\d.e+-]+( s on )"
)


class Masks:
    """Named values of one world that may differ between neighbours without depending on the private data.

    Each is replaced, everywhere it appears (stdout, stderr, JSON documents, file contents, decoded DSSE payloads),
    by ``<name>``:

    - ``run_id``: a fresh random id per run (uuid4), not a function of the data;
    - ``started_at``: the wall clock taken BEFORE the data is read (ISO 8601, and as whole epoch seconds where it
      names the TensorBoard event file and stamps every released file's mtime); its neighbour's clock is a
      different moment, not a different dataset;
    - ``sha256:<file>``: the digest of a compared file (adapter weights, card, synthetic file, exported model, a
      signed payload): the file's own content is compared (masked) beside it, so the mask hides nothing new;
    - ``signature``: Ed25519 signatures over payloads that are themselves compared decoded;
    - ``probe time``: the three durations of ``train``'s ``estimate:`` line (total, per step, per synthetic
      forward), the wall time of a forward and backward of SYNTHETIC records (token 1, ``max_seq_len`` tokens) on
      this machine, which differs between any two runs; every other number on that line (T, forwards per step,
      records, tokens, B) stays compared, and ``tests/run/test_estimate.py`` checks that the estimate's inputs are
      identical on neighbouring datasets once the clock is fixed.

    DP outputs are compared by their public shape only, never by value, since they are random by design (fresh
    noise and Poisson batches from OS entropy) even on identical data: safetensors files by their header (tensor
    names, dtypes, shapes) and size, generated text (``generate`` replies, ``synth`` rows) by the number of items.
    """

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.started = 0.0  # started_at in epoch seconds

    def add(self, value, name: str) -> None:
        if value not in (None, ""):
            self.values[str(value)] = f"<{name}>"
        if name.startswith(("sha256:", "record:")):
            self.values[str(value)[:12]] = f"<{name}[:12]>"  # verify prints a digest's first 12 hex digits

    def text(self, text: str) -> str:
        text = ESTIMATE_TIMES.sub(r"\1<probe time>\2<probe time>\3<probe time>\4", text)
        for value in sorted(self.values, key=len, reverse=True):
            text = text.replace(value, self.values[value])
        return text

    def doc(self, obj):
        """A JSON value with masks applied to every string and key; signed payloads decoded and masked too."""
        if isinstance(obj, dict):
            return {self.text(k): ("<signature>" if k == "sig" else self.doc(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.doc(v) for v in obj]
        if isinstance(obj, str):
            decoded = decoded_payload(obj)
            return self.doc(decoded) if decoded is not None else self.text(obj)
        return obj


def decoded_payload(text: str):
    """The JSON statement inside a DSSE/Sigstore ``payload`` (base64), else None."""
    if len(text) < 40 or not text.startswith("eyJ"):
        return None
    try:
        return json.loads(base64.b64decode(text, validate=True))
    except ValueError:
        return None


def run_dplora(args: list[str], env: dict) -> dict:
    result = CliRunner().invoke(app, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return {"args": [str(a) for a in args], "exit": result.exit_code, "stdout": result.stdout, "stderr": result.stderr}


def safetensors_header(path: Path) -> dict:
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + size])
    return {
        "bytes": len(raw),
        "tensors": {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"},
    }


def tfevents(path: Path, masks: Masks) -> list:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for event in EventFileLoader(str(path)).Load():
        values = [(v.tag, round(float(v.simple_value), 12)) for v in event.summary.value if v.HasField("simple_value")]
        # wall times are the record's start + step (public); compared relative to started_at
        out.append({"wall_time": event.wall_time - masks.started, "step": event.step, "values": values})
    return out


def generated_summary(kind: str, text: str) -> dict:
    """Generated text (a DP output, random by design): only its public shape."""
    if kind == "jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {"lines": len(rows), "keys": [sorted(r) for r in rows], "prompts": [r.get("prompt") for r in rows]}
    rows = list(csv.DictReader(text.splitlines()))
    return {"rows": len(rows), "columns": list(rows[0]) if rows else []}


def public_surface(world: Path, outputs: list[dict], masks: Masks, generated: dict[str, str]) -> dict:
    """Everything public in ``world``: outputs of each command and every file outside ``.private`` (masked)."""
    for path in sorted(p for p in world.rglob("*") if p.is_file()):
        masks.add(hashlib.sha256(path.read_bytes()).hexdigest(), f"sha256:{path.relative_to(world)}")
        if path.name.endswith(".dsse.json"):
            envelope = json.loads(path.read_text())
            masks.add(hashlib.sha256(base64.b64decode(envelope["payload"])).hexdigest(), f"record:{path.name}")
            predicate = decoded_payload(envelope["payload"]).get("predicate", {})
            masks.add(predicate.get("run_id"), "run_id")
            masks.add(predicate.get("started_at"), "started_at")
    for value, name in list(masks.values.items()):
        if name == "<started_at>":
            masks.started = datetime.fromisoformat(value).timestamp()
            masks.add(int(masks.started), "started_at")
    files = {}
    for path in sorted(world.rglob("*")):
        rel = path.relative_to(world)
        if any(part.endswith(".private") for part in rel.parts) or rel.parts[0].startswith(NOT_PUBLIC):
            continue
        key = masks.text(str(rel))
        # the job's own inputs (contract, prompts) carry the user's mtimes; everything dplora wrote is compared
        entry = {"mtime": "input" if str(rel) in INPUTS else masks.text(str(int(path.stat().st_mtime)))}
        if path.is_dir():
            files[key + "/"] = entry
            continue
        if path.suffix == ".safetensors":
            entry["content"] = safetensors_header(path)
        elif ".tfevents." in path.name:
            entry["content"] = tfevents(path, masks)
        elif str(rel) in generated:
            entry["content"] = generated_summary(generated[str(rel)], path.read_text())
        elif path.suffix == ".json":
            entry["content"] = masks.doc(json.loads(path.read_text()))
        else:
            entry["content"] = masks.text(path.read_text())
        files[key] = entry
    shown = []
    for out in outputs:
        item = {"args": masks.text(" ".join(out["args"])), "exit": out["exit"], "stderr": masks.text(out["stderr"])}
        if out.get("generated"):
            item["stdout"] = generated_summary("jsonl", out["stdout"])
        elif out["stdout"].lstrip().startswith("{"):
            item["stdout"] = masks.doc(json.loads(out["stdout"]))
        else:
            item["stdout"] = masks.text(out["stdout"])
        shown.append(item)
    return {"outputs": shown, "files": files}


def diff_surfaces(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in diff_surfaces(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in diff_surfaces(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def ci_env(world: Path, show_private: str = "") -> dict:
    """The environment of a CI job in ``world`` (``CI=true``, its own ledger and cache)."""
    return {
        "CI": "true",
        "DPLORA_LEDGER": str(world / "ledger.sqlite3"),
        "DPLORA_CACHE_DIR": str(world / "cache"),
        "DPLORA_SHOW_PRIVATE": show_private,
    }


def surface_contract(world: Path, model: Path, data_path: Path, output: Path | None = None, **sections) -> Path:
    raw = contract_base(model, data_path, output or world / "run")
    raw["data"]["eval_fraction"] = 0.2
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    path = world / "contract.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def read_text_file(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames), list(reader)


def write_text_file(path: Path, columns: list[str], rows: list[dict]) -> Path:
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path
