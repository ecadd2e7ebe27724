"""Generate realistic, entirely fake customer-support tickets for demos and tests.

The README demo needs a data set with the same shape as a private one (several tickets per
customer, personal details embedded in free text) without touching anyone's real data. Every
detail here is invented: names come from short lists of common first/last names, emails use the
reserved ``example.com``/``example.org``/``example.net`` domains (RFC 2606), phone numbers use
the fictional ``+1-555-0100``..``+1-555-0199`` range, and order, card and street numbers are random.

Output format (``.csv`` with a header row, or ``.jsonl`` with one JSON object per line), one row
per ticket, all values strings: ``ticket_id`` (``T-000123``), ``customer_id`` (``C-00042``),
``message`` (the customer's text) and ``reply`` (the agent's text). Standard library only.

Conversation format (``record_format="messages"``, ``.jsonl`` only): one row per ticket, ``ticket_id``,
``customer_id`` and ``messages`` (``[{"role": "user", ...}, {"role": "assistant", ...}, ...]``: the ticket's
exchanges in order, a follow-up user turn and agent reply for a multi-turn ticket).
"""

from __future__ import annotations

import csv
import json
import random
from collections import Counter
from pathlib import Path

from dplora import atomic
from dplora.errors import BadInputError

COLUMNS = ("ticket_id", "customer_id", "message", "reply")
CONVERSATION_COLUMNS = ("ticket_id", "customer_id", "messages")
RECORD_FORMATS = ("rows", "messages")
DEFAULT_CONVERSATION_TURNS = 2  # messages format: about half the tickets get a follow-up exchange
ALLOWED_SUFFIXES = (".csv", ".jsonl")
MAX_TICKETS_PER_CUSTOMER = 5

FIRST = (
    "Aisha Liam Mei Carlos Priya Jonas Fatima Noah Yuki Olumide Sofia Mateo Hannah Ravi Chloe Omar Ingrid "
    "Diego Amara Lukas Nadia Kenji Zoe Tomasz Leila Samuel Ana Dmitri Grace Kwame Elena Farid"
).split()
LAST = (
    "Okafor Nguyen Schmidt Garcia Patel Kowalski Haddad Johansson Tanaka Mensah Rossi Fernandez Cohen Singh "
    "Dubois Kim Novak Alvarez Osei Larsen Ivanova Moreau Yilmaz Brennan Sato Mwangi Costa Walsh Reyes Bauer"
).split()
AGENTS = ("Sam", "Alex", "Jordan", "Priya", "Marco", "Lena", "Tom", "Rosa", "Kai", "Ines")
STREETS = ("Maple Ave", "Oak Street", "Elm Road", "Cedar Lane", "Birch Blvd", "Willow Way", "Harbor Drive")
CITIES = ("Springfield", "Riverton", "Lakeside", "Fairview", "Brookfield", "Greenville", "Hillcrest")
PRODUCTS = (
    "wireless headphones|coffee maker|running shoes|phone case|desk lamp|blender|winter jacket|smart watch|"
    "router|backpack|tablet|air fryer"
).split("|")
PLANS = ("Unlimited plan", "Premium membership", "Family plan", "Basic subscription", "5G data plan")
DATES = ("Monday", "last Tuesday", "the 3rd", "March 14", "yesterday", "last week", "the 21st", "Friday")
GREETINGS = ("", "", "Hi,", "Hello,", "Hi there,", "Hey,", "Good morning,", "Dear support,")
SIGNOFFS = ("", "", "Thanks.", "Thank you!", "Thanks, {first}", "Regards, {name}", "Please help.", "Cheers")
ACKS = (
    "Thanks for reaching out and sorry for the trouble.|I'm sorry to hear about this.|Thank you for "
    "contacting us.|Thanks for your patience while I looked into it.|Apologies for the inconvenience."
).split("|")
GENERIC_ASKS = (
    "Any update would be appreciated.|Please get back to me soon.|I need this sorted out quickly.|"
    "Could someone look into it today?|Let me know what you need from me."
).split("|")
CLOSERS = ("Is there anything else I can help with?", "Just reply here if you need anything else.")
REPLY_GREETINGS = ("Hi {first},", "Hello {first},", "Hi {first}!", "Dear {name},", "Hi,")
REPLY_SIGNOFFS = ("", "", "- {agent}", "Best, {agent}", "Kind regards, {agent}")

# One block per intent: "P" = customer problem sentence, "A" = customer request, "R" = agent action.
# Placeholders ({order}, {email}, ...) are filled per ticket by _ticket().
_TEMPLATES = """
# refund
P I returned the {product} from order {order} on {date} but have not seen my {amount} refund yet.
P I sent back order {order} two weeks ago and the refund still hasn't reached my card ending {card}.
A Can you tell me when the money will arrive? | Please process my refund as soon as possible.
R I can see the return for {order}; the {amount} refund was issued and should reach card {card} soon.
R I've pushed the refund for {order} through manually, so expect it within {days} business days.
# late_delivery
P My order {order} was supposed to arrive {date} and it is still not here.
P The {product} I ordered ({order}) is {days} days late and tracking hasn't moved.
A Where is my package? | Can you check what is going on with the delivery?
R The carrier reports a delay on {order}; it should arrive within {days} days and I added a shipping credit.
R I've escalated {order} with the courier and will email {email} as soon as it moves again.
# wrong_item
P I ordered a {product} in order {order} but received something completely different.
P The box for order {order} arrived {date} with the wrong item inside instead of my {product}.
A How do I get the right one? | I'd like the correct item sent please.
R I've sent a prepaid return label to {email} and shipped the correct {product} for {order} today.
R A replacement for {order} is on its way; please keep the wrong item, no need to return it.
# cancel_order
P I placed order {order} {date} by mistake and want to cancel it before it ships.
P Please cancel order {order}, I found the {product} cheaper elsewhere.
A Can you confirm the cancellation? | I don't want to be charged for it.
R Order {order} is cancelled and the {amount} hold on card {card} will drop off in {days} days.
R I cancelled {order} before it left the warehouse; you'll get a confirmation at {email}.
# change_address
P I moved recently, please send order {order} to {new_address} instead of {address}.
P The shipping address on {order} is wrong, it should be {new_address}.
A Is it too late to change it? | Please update it before it ships.
R I've updated {order} to ship to {new_address}; the expected delivery date stays the same.
R Done, the address on your account and on {order} is now {new_address}.
# double_charge
P I was charged {amount} twice for order {order} on my card ending {card}.
P My statement shows two identical charges of {amount} from {date}, card ending {card}.
A Please refund the duplicate. | Can you look into this billing error?
R I confirmed the duplicate {amount} charge and reversed it; it should clear in {days} business days.
R The second charge on card {card} was a pending authorization and will drop off within {days} days.
# password_reset
P I can't log in and the password reset email never arrives at {email}.
P The reset link I got {date} says it has expired every time I click it.
A Can you send me a new one? | How do I get back into my account?
R I've sent a fresh reset link to {email}; it is valid for 24 hours, so please check spam too.
R I reset the link manually; please try again from the login page and use the newest email only.
# account_locked
P My account was locked after too many login attempts and I can't access it.
P I got a message that my account is locked for security reasons, my phone is {phone}.
A Please unlock it. | What do I need to do to verify myself?
R After verifying the code sent to {phone}, I unlocked your account; please set a new password.
R Your account is unlocked now; we locked it after several failed attempts to protect you.
# invoice_request
P I need an invoice for order {order} with my company details for my expense report.
P Could you send me a VAT invoice for the {amount} I paid {date}?
A Please email it to {email}. | I need it by the end of the month.
R I've emailed invoice {invoice} for {order} to {email}; you can also download it under Orders.
R Invoice {invoice} with your company details is on your account and was also sent to {email}.
# damaged_item
P The {product} from order {order} arrived broken, the box was completely crushed.
P My {product} came with a cracked screen, order {order}, delivered {date}.
A I want a replacement or a refund. | I can send photos if needed.
R Sorry it arrived damaged; a replacement {product} ships today and no return is needed.
R I've refunded {amount} for {order} to card {card}; feel free to dispose of the damaged item.
# subscription_cancel
P I want to cancel my {plan} before the next renewal, I don't use it anymore.
P Please stop renewing my {plan}, I was charged {amount} again {date}.
A Can you confirm it is cancelled? | I'd also like the last payment refunded if possible.
R Your {plan} is cancelled and won't renew; you keep access until the end of the billing period.
R I cancelled the {plan} and refunded the {amount} renewal to your card ending {card}.
# warranty
P My {product} stopped working after {days} months, is it still under warranty?
P The {product} I bought in order {order} won't turn on anymore.
A How do I make a warranty claim? | Can I get it repaired or replaced?
R Your {product} is covered by the 12-month warranty; I opened claim {invoice} and emailed {email}.
R Good news, it's under warranty; a courier will collect it from {address} this week.
# payment_failed
P My payment for order {order} keeps failing even though my card ending {card} works elsewhere.
P Checkout says payment declined for {amount}, I tried three times {date}.
A Was I charged anything? | What should I do?
R No charge went through; your bank's fraud check declined it, so please approve it and retry.
R The failed attempts were not charged, and I've saved your cart so you can simply retry.
# tracking
P I haven't received a tracking number for order {order} yet.
P The tracking link for {order} shows no new information since {date}.
A Can you send it to me? | Where can I follow my parcel?
R Your tracking number is {tracking}; the parcel left our warehouse and updates within 24 hours.
R I've re-sent tracking {tracking} for {order} to {email}; it is now with the courier.
# complaint
P I've called three times about order {order} and nobody has helped me so far.
P Honestly the service has been terrible, my issue from {date} is still not resolved.
A I want to speak to a manager. | I'm thinking about closing my account.
R I'm sorry about your experience; I escalated this to a supervisor who will call {phone} today.
R You're right to be frustrated; I've added a {amount} credit and will own this until it's solved.
# plan_change
P I'd like to switch from my current plan to the {plan} starting next month.
P Can I upgrade to the {plan} on my line {phone} without signing a new contract?
A What will it cost? | Please let me know the new monthly price.
R I've scheduled the switch to the {plan} from your next bill; the new price is {amount} a month.
R Your line {phone} moves to the {plan} today, and no new contract is needed.
# card_lost
P I lost my debit card ending {card} {date} and need to block it right away.
P I think my card ending {card} was stolen, there's a charge of {amount} I don't recognize.
A Please freeze it. | Can you send a new card to {address}?
R Card {card} is now blocked and a replacement will arrive at {address} within {days} business days.
R I froze card {card} and opened a dispute for the {amount} charge; we'll update you at {email}.
"""


def _parse_templates(text: str) -> dict[str, dict[str, list[str]]]:
    intents: dict[str, dict[str, list[str]]] = {}
    for line in text.strip().splitlines():
        if line.startswith("# "):
            current = intents.setdefault(line[2:], {"P": [], "A": [], "R": []})
        else:
            current[line[0]].extend(part.strip() for part in line[2:].split(" | "))
    return intents


INTENTS = _parse_templates(_TEMPLATES)


def _customer(rng: random.Random) -> dict[str, str]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    sep = rng.choice((".", "_", ""))
    user = f"{first}{sep}{last}".lower() + (str(rng.randint(1, 99)) if rng.random() < 0.5 else "")
    return {
        "first": first,
        "name": f"{first} {last}",
        "email": f"{user}@example.{rng.choice(('com', 'org', 'net'))}",
        "phone": f"+1-555-01{rng.randint(0, 99):02d}",
        "address": _address(rng),
        "card": f"{rng.randint(0, 9999):04d}",
        "orders": [f"ORD-{rng.randint(100000, 999999)}" for _ in range(rng.randint(1, 3))],
    }


def _address(rng: random.Random) -> str:
    return f"{rng.randint(1, 999)} {rng.choice(STREETS)}, {rng.choice(CITIES)} {rng.randint(10000, 99999)}"


def _typo(text: str, rng: random.Random) -> str:
    """Swap two adjacent letters inside one lowercase word (never a name, email or id)."""
    words = text.split(" ")
    idx = [i for i, w in enumerate(words) if w.isalpha() and w.islower() and len(w) >= 5]
    if not idx:
        return text
    i = rng.choice(idx)
    w, j = words[i], rng.randint(1, len(words[i]) - 3)
    words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2 :]
    return " ".join(words)


def _ticket(cust: dict, rng: random.Random) -> tuple[str, str]:
    intent = INTENTS[rng.choice(list(INTENTS))]
    problems, asks, actions = intent["P"], intent["A"], intent["R"]
    slots = {
        **cust,
        "order": rng.choice(cust["orders"]),
        "product": rng.choice(PRODUCTS),
        "plan": rng.choice(PLANS),
        "date": rng.choice(DATES),
        "amount": f"${rng.randint(5, 499)}.{rng.randint(0, 99):02d}",
        "days": str(rng.randint(3, 10)),
        "new_address": _address(rng),
        "invoice": f"INV-{rng.randint(10000, 99999)}",
        "tracking": f"TRK{rng.randint(10**9, 10**10 - 1)}",
        "agent": rng.choice(AGENTS),
    }
    parts = [rng.choice(GREETINGS), rng.choice(problems)]
    if rng.random() < 0.9:
        parts.append(rng.choice(asks) if rng.random() < 0.7 else rng.choice(GENERIC_ASKS))
    parts.append(rng.choice(SIGNOFFS))
    message = " ".join(p for p in parts if p).format(**slots)
    if rng.random() < 0.12:
        message = _typo(message, rng)
    if rng.random() < 0.05:  # casual all-lowercase typing; ids and emails keep their case
        message = " ".join(w if any(c.isdigit() or c == "@" for c in w) else w.lower() for w in message.split(" "))
    parts = [rng.choice(REPLY_GREETINGS), rng.choice(ACKS) if rng.random() < 0.7 else "", rng.choice(actions)]
    parts += [rng.choice(CLOSERS) if rng.random() < 0.2 else "", rng.choice(REPLY_SIGNOFFS)]
    reply = " ".join(p for p in parts if p).format(**slots)
    return message, reply


FOLLOW_UPS = (
    "Any update on this? It has been {days} days.",
    "Just following up on order {order}, I still have not heard back.",
    "Thanks, but the problem is still there. Can you check again?",
    "I tried that and it did not work. My email is {email} if you need it.",
    "Can someone call me at {phone}? This is taking too long.",
)
FOLLOW_UP_REPLIES = (
    "Thanks for your patience, {first}. I checked again and escalated it; you will hear from us within {days} days.",
    "Sorry for the wait, {first}. I have added a note to order {order} and a specialist will follow up by email.",
    "I understand, {first}. I reopened the case and will call you at {phone} today.",
)


def _follow_up(cust: dict, rng: random.Random) -> tuple[str, str]:
    slots = {**cust, "order": rng.choice(cust["orders"]), "days": str(rng.randint(2, 9))}
    return rng.choice(FOLLOW_UPS).format(**slots), rng.choice(FOLLOW_UP_REPLIES).format(**slots)


def generate_tickets(*, num_tickets: int = 1000, seed: int = 0, max_turns: int = 1) -> list[dict[str, str]]:
    """Generate fake support tickets, 1 to 5 per customer, deterministically from ``seed``.

    Each customer draws a ticket count uniformly from 1..5 (the last customer may be cut short so
    the total is exactly ``num_tickets``) and keeps one name, email, phone, address and card across
    their tickets. Rows are shuffled so a customer's tickets are interleaved, as in a real queue.

    Args:
        num_tickets: Number of rows to produce (>= 1).
        seed: Seed for ``random.Random``; the same seed always gives the same rows.
        max_turns: Each ticket has 1..max_turns message/reply exchanges, one row each, sharing the
            ticket_id (follow-ups reuse the customer's details). 1 gives one row per ticket.

    Returns:
        A list of rows with exactly the keys ``ticket_id``, ``customer_id``, ``message``, ``reply``
        (all ``str``). Messages and replies are 1-2 sentences, typically 15-45 words each. With
        max_turns > 1 there are more rows than tickets.

    Raises:
        BadInputError: If ``num_tickets`` is not a positive int or ``seed`` is not an int.
    """
    if isinstance(num_tickets, bool) or not isinstance(num_tickets, int) or num_tickets < 1:
        raise BadInputError(f"num_tickets must be a positive integer, got {num_tickets!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise BadInputError(f"seed must be an integer, got {seed!r}")
    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise BadInputError(f"max_turns must be a positive integer, got {max_turns!r}")
    rng = random.Random(seed)
    drafts: list[list[tuple[str, str, str]]] = []
    cid = 0
    while len(drafts) < num_tickets:
        cid += 1
        cust = _customer(rng)
        for _ in range(min(rng.randint(1, MAX_TICKETS_PER_CUSTOMER), num_tickets - len(drafts))):
            turns = [(f"C-{cid:05d}", *_ticket(cust, rng))]
            turns += [(f"C-{cid:05d}", *_follow_up(cust, rng)) for _ in range(rng.randint(1, max_turns) - 1)]
            drafts.append(turns)
    rng.shuffle(drafts)
    return [
        {"ticket_id": f"T-{i:06d}", "customer_id": c, "message": m, "reply": r}
        for i, turns in enumerate(drafts, start=1)
        for (c, m, r) in turns
    ]


def write_records(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...], *, overwrite: bool) -> Path:
    """Write rows to ``.csv`` (with header) or ``.jsonl``, atomically (temp file + ``os.replace``).

    Args:
        path: Destination; its suffix picks the format. Parent directories are created.
        rows: Records whose keys are exactly ``columns``.
        columns: Column order for CSV and key order for JSONL.
        overwrite: Replace an existing file if True; otherwise refuse.

    Returns:
        The destination path.

    Raises:
        BadInputError: On an unsupported suffix or an existing file without ``overwrite``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in ALLOWED_SUFFIXES:
        raise BadInputError(f"unsupported output suffix {path.suffix!r}; use one of {', '.join(ALLOWED_SUFFIXES)}")
    if path.exists() and not overwrite:
        raise BadInputError(f"{path} already exists; pass --overwrite to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.replacing(path, text=True, newline="") as fh:  # whole or not at all; DiskFullError names it
        if suffix == ".csv":
            writer = csv.DictWriter(fh, fieldnames=list(columns))
            writer.writeheader()
            writer.writerows(rows)
        else:
            for row in rows:
                fh.write(json.dumps({k: row[k] for k in columns}, ensure_ascii=False) + "\n")
    return path


def ticket_conversations(rows: list[dict[str, str]]) -> list[dict]:
    """Group :func:`generate_tickets` rows into one conversation per ticket (rows of a ticket are consecutive).

    Returns:
        ``{"ticket_id", "customer_id", "messages": [{"role": "user", "content": message}, {"role": "assistant",
        "content": reply}, ...]}`` per ticket, in file order.
    """
    out: list[dict] = []
    for row in rows:
        if not out or out[-1]["ticket_id"] != row["ticket_id"]:
            out.append({"ticket_id": row["ticket_id"], "customer_id": row["customer_id"], "messages": []})
        out[-1]["messages"] += [
            {"role": "user", "content": row["message"]},
            {"role": "assistant", "content": row["reply"]},
        ]
    return out


def write_tickets(
    path: Path,
    *,
    num_tickets: int = 1000,
    seed: int = 0,
    overwrite: bool = False,
    max_turns: int | None = None,
    record_format: str = "rows",
) -> dict:
    """Generate fake tickets with :func:`generate_tickets` and write them to ``path``.

    Args:
        path: Output file ending in ``.csv`` or ``.jsonl``.
        num_tickets: Number of tickets (rows) to write.
        seed: Random seed; same seed, same file.
        overwrite: Replace an existing file if True.
        max_turns: Exchanges per ticket, 1..max_turns (one row each; one conversation with messages). None: 1 for
            rows, :data:`DEFAULT_CONVERSATION_TURNS` for messages.
        record_format: ``rows`` (one message/reply row per exchange) or ``messages`` (one conversation per ticket,
            ``.jsonl`` only; see the module docstring).

    Returns:
        ``{"path": str, "num_tickets": int, "num_rows": int, "num_customers": int,
        "tickets_per_customer": {"min": int, "max": int, "mean": float}}``; ``num_rows`` counts the records written
        (conversations with messages).

    Raises:
        BadInputError: On a bad suffix (messages: not ``.jsonl``), an existing file without ``overwrite``, or bad
            arguments.
    """
    if record_format not in RECORD_FORMATS:
        raise BadInputError(f"--format={record_format!r}: give one of {', '.join(RECORD_FORMATS)}")
    if record_format == "messages" and Path(path).suffix.lower() != ".jsonl":
        raise BadInputError(f"{path}: conversations are written as .jsonl (a csv cell cannot hold a list of turns)")
    if max_turns is None:
        max_turns = DEFAULT_CONVERSATION_TURNS if record_format == "messages" else 1
    rows = generate_tickets(num_tickets=num_tickets, seed=seed, max_turns=max_turns)
    if record_format == "messages":
        written = ticket_conversations(rows)
        out = write_records(Path(path), written, CONVERSATION_COLUMNS, overwrite=overwrite)
    else:
        written = rows
        out = write_records(Path(path), rows, COLUMNS, overwrite=overwrite)
    tickets = {row["ticket_id"]: row["customer_id"] for row in rows}
    per = list(Counter(tickets.values()).values())
    return {
        "path": str(out),
        "num_tickets": len(tickets),
        "num_rows": len(written),
        "num_customers": len(per),
        "tickets_per_customer": {"min": min(per), "max": max(per), "mean": round(sum(per) / len(per), 3)},
    }
