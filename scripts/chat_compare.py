"""Issue 28's comparison: adapters trained through the chat template vs in today's raw format, both served through it.

On the packaged SmolLM2-135M-Instruct and the demo tickets (configs/demo.yaml: same steps, ε, data and seed), train
twice, once with ``data.chat_template: none`` (raw ``f"{prompt}\\n" + response``) and once with ``auto`` (ChatML),
then evaluate both on the same held-out split **through the template** (the way the model is served) and generate
one reply of each to the same prompt. Prints one JSON object (and writes it to ``<workdir>/chat_compare.json``).

    python scripts/chat_compare.py                 # the packaged model, 1000 demo tickets (~30 min of 2 CPU cores)
    python scripts/chat_compare.py --toy           # a tiny random Llama with a ChatML template (seconds; tests)

The held-out numbers are computed on the demo's public synthetic tickets, so they may be shown.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "I was charged twice for my last order, can you refund one of the charges?"
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def toy_model(folder: Path) -> Path:
    """A random 2-layer Llama (hidden 16) and a byte-level tokenizer with ChatML markers and template."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))} | {"<pad>": 256, "<eos>": 257}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=260,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=256,
        eos_token_id=257,
        bos_token_id=257,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def contracts(work: Path, toy: bool) -> dict[str, dict]:
    """The demo contract twice (raw and template), differing only in data.chat_template and output_dir."""
    from dplora.data.demo import write_tickets

    raw = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    tickets = work / "tickets.csv"
    write_tickets(tickets, num_tickets=60 if toy else 1000, seed=0, overwrite=True)
    raw["data"]["path"] = str(tickets)
    if toy:
        raw["model"] = {"path": str(toy_model(work / "toy-model"))}
        raw["privacy"]["num_units"] = 60
        raw["privacy"]["accountant"] = "rdp"
        raw["training"].update(steps=2, expected_batch_size=8, physical_batch_size=4, max_seq_len=160, threads=1)
    out = {}
    for name, setting in (("raw", "none"), ("template", "auto")):
        c = json.loads(json.dumps(raw))
        c["data"]["chat_template"] = setting
        c["training"]["output_dir"] = str(work / name)
        out[name] = c
    return out


def train(work: Path, name: str, contract: dict, key: Path) -> Path:
    """``dplora train`` in a subprocess; returns the run folder."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(contract))
    cmd = [sys.executable, "-m", "dplora", "train", str(path), "--signing-key", str(key), "--no-progress"]
    subprocess.run([*cmd, "--overwrite"], check=True, cwd=ROOT)
    return Path(contract["training"]["output_dir"])


def served(run_folder: Path, template_contract) -> dict:
    """Held-out loss (base vs adapter) and one greedy reply of ``run_folder``'s adapters, through the template."""
    from dplora.evaluate.generate import Sampling, generate_replies
    from dplora.evaluate.heldout import evaluate_model, held_out_table
    from dplora.release.read import load_adapter_model, read_run

    run = read_run(run_folder)
    model, tokenizer, device = load_adapter_model(run, log=lambda *_: None)
    table = held_out_table(
        run.contract.data, unit_key=run.contract.privacy.unit_key, seed=run.contract.training.seed
    )  # the split training held out (same seed and fraction in both runs)
    evaluation = evaluate_model(
        model,
        tokenizer,
        table,
        template_contract.data,
        template_contract.training,
        device=device,
        source="demo",
        public=True,
        private_run=True,
    )
    sampling = Sampling(max_new_tokens=32)
    reply = generate_replies(
        model,
        tokenizer,
        [PROMPT],
        data=template_contract.data,
        training=template_contract.training,
        sampling=sampling,
        device=device,
    )
    return {
        "held_out_loss_adapter": evaluation.adapter.loss,
        "held_out_loss_base": evaluation.base.loss,
        "held_out_tokens": evaluation.adapter.tokens,
        "reply": reply[0],
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison; returns (and prints) the result."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--toy", action="store_true", help="a tiny random model and 60 tickets (seconds)")
    parser.add_argument("--workdir", type=Path, default=None, help="where runs go (default: a temporary folder)")
    args = parser.parse_args(argv)
    from dplora.contract.loader import parse_contract
    from dplora.release.keys import generate_keypair

    with tempfile.TemporaryDirectory(prefix="dplora-chat-compare-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        key = work / "compare.key"
        if not key.exists():
            generate_keypair(key)
        both = contracts(work, args.toy)
        template_contract = parse_contract(both["template"])
        result = {"prompt": PROMPT, "toy": args.toy, "evaluated_through": "the model's chat template"}
        for name, contract in both.items():
            result[name] = served(train(work, name, contract, key), template_contract)
        (work / "chat_compare.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
