"""Generated support tickets: a queue label to learn, fields to extract, and real leaks.

Each conversation belongs to one of six queues (imbalanced 35/25/15/12/8/5 % of conversations,
exactly) and holds 1-4 customer messages spread over about six months (`created_at`). The
queue is written in the words of most messages ("charged twice", "tracking", "return label"
...), so a small model can beat the majority baseline; about 12 % of conversations open with a
queue-neutral request, so no model reaches 100 %. Every message carries an extraction target
`fields` with `order_id`, `product`, `amount` (a number) and `date`; a field the message does
not mention is null.

The redundancy is the kind real ticket data has, and the kind the audit must catch (D2, D8):
- a follow-up that re-sends the first message with a short prefix or another sign-off: a near
  duplicate (word-shingle Jaccard about 0.85) *inside one conversation*;
- a few stock messages ("Thanks, that solved it!") repeated verbatim across conversations:
  exact duplicates that `drop_exact_duplicates` removes.
Every other message holds at least two random values (order number, amount, date, e-mail), so
messages of *different* conversations never come near the 0.8 threshold. Hence a random row
split leaks conversations and near copies across splits, while a split by `conversation_id`
with `drop_exact_duplicates` leaves none: tests/test_demo_data.py proves both.

Deterministic from the seed (`random.Random`); no global state is touched.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

QUEUES = {  # queue -> share of conversations
    "billing": 0.35,
    "delivery": 0.25,
    "returns": 0.15,
    "technical": 0.12,
    "account": 0.08,
    "security": 0.05,
}
PRODUCTS = [
    "wireless headphones",
    "coffee grinder",
    "standing desk",
    "smart watch",
    "air fryer",
    "robot vacuum",
    "hiking backpack",
    "electric kettle",
    "gaming mouse",
    "yoga mat",
    "desk lamp",
    "bluetooth speaker",
    "rain jacket",
    "office chair",
    "blender",
    "phone case",
    "running shoes",
    "baby monitor",
    "tablet stand",
    "water filter",
]
NAMES = [
    "anna",
    "ben",
    "carla",
    "dev",
    "emma",
    "farid",
    "grace",
    "hugo",
    "ines",
    "jon",
    "kira",
    "liam",
    "maya",
    "nils",
    "olga",
    "pablo",
    "rosa",
    "sami",
    "tara",
    "yusuf",
]

# First messages. Slots: {order_id} {product} {amount} {date} {email} {code}; each template
# holds at least two values that vary per conversation, far enough apart to break shingles.
OPENERS = {
    "billing": [
        "I was charged twice for order {order_id}, the {product} cost {amount} but my card "
        "statement shows two payments",
        "my invoice for the {product} shows {amount} instead of the price I was quoted at "
        "checkout on {date}",
        "I was billed {amount} on {date} for a subscription renewal that I cancelled last month",
        "please refund the overcharge on order {order_id}, the payment of {amount} was taken "
        "twice from my card",
        "the discount code was not applied to my invoice for order {order_id}, I paid the full "
        "price of {amount}",
    ],
    "delivery": [
        "my {product} from order {order_id} has not arrived yet and the tracking page has not "
        "moved since {date}",
        "the courier marked order {order_id} as delivered on {date} but there is no parcel at "
        "my door",
        "where is my package? I ordered the {product} on {date} and the estimated delivery "
        "date has passed",
        "the tracking number for order {order_id} does not work on the carrier website since "
        "{date}",
        "can you ship the {product} from order {order_id} to a different address? the "
        "shipment is still in transit",
    ],
    "returns": [
        "I want to return the {product} from order {order_id} because it is the wrong size",
        "the {product} from order {order_id} arrived damaged and I would like an exchange or a "
        "return label",
        "how do I send back the {product}? I bought it on {date} and it does not fit, order "
        "{order_id}",
        "I returned order {order_id} on {date} and still have no return confirmation",
        "can I exchange the {product} from order {order_id} for a different colour while the "
        "return window is open?",
    ],
    "technical": [
        "the app crashes with error {code} every time I open the page for my {product}",
        "my {product} will not connect to wifi after the firmware update on {date}, it shows "
        "error {code}",
        "the website shows error {code} when I try to check out order {order_id}",
        "the {product} keeps restarting and the screen goes black since {date}, error {code}",
        "bluetooth pairing fails between my phone and the {product}, the app shows error "
        "{code} after reinstalling",
    ],
    "account": [
        "I cannot log in to my account {email}, the password reset email never arrived since "
        "{date}",
        "please change the email address on my profile, I no longer use {email} since {date}",
        "I want to delete my account {email} and all my personal data, my last order was "
        "{order_id}",
        "my username was changed and now I cannot sign in with {email} to see order {order_id}",
        "how do I update the phone number on my account profile {email}? the settings page "
        "shows code {code}",
    ],
    "security": [
        "someone placed order {order_id} for a {product} using my account without my "
        "permission on {date}",
        "I got a suspicious email asking for my password that claims to be from your store, "
        "sent to {email} on {date}",
        "there is an unauthorized payment of {amount} on {date} that I did not make, I think my "
        "account was hacked",
        "I received a login alert from an unknown device for {email}, please lock my account, "
        "code {code}",
    ],
}
# Queue-neutral requests: the words do not say the queue, so no model scores 100 %.
VAGUE = [
    "I have a problem with order {order_id} from {date}, can someone call me back about it",
    "please look into order {order_id} for the {product}, something is not right since {date}",
    "I need help with my {product} from order {order_id} as soon as possible",
]
VAGUE_SHARE = 0.12
# New information later in a conversation, same queue vocabulary, two varying values.
FOLLOW_UPS = {
    "billing": [
        "to add: the amount charged was {amount} and the order number is {order_id}, the "
        "double charge is still on my card",
        "I checked my bank statement again and the charge of {amount} from {date} is still "
        "there, please refund it",
    ],
    "delivery": [
        "update: the tracking for {order_id} still says in transit since {date}, no delivery yet",
        "I paid {amount} for next day delivery of order {order_id} and the parcel is still "
        "not here",
    ],
    "returns": [
        "I have packed the {product} for return, the order number is {order_id} and the "
        "label is missing",
        "the refund for the returned {product} should be {amount}, I shipped it back on {date}",
    ],
    "technical": [
        "the {product} still shows error {code} after a factory reset on {date}",
        "order {order_id} was the {product}, the app still crashes with error {code} when I "
        "open it",
    ],
    "account": [
        "I still cannot log in with {email}, the reset link from {date} has expired",
        "the password reset for {email} still fails, my last order was {order_id}",
    ],
    "security": [
        "another unauthorized charge of {amount} appeared on {date}, please block my card",
        "please cancel order {order_id}, I did not place it and my password for {email} was "
        "changed",
    ],
}
GREETINGS = ["", "Hi, ", "Hello, ", "Good morning, ", "Hi there, ", "Dear support, "]
SIGN_OFFS = ["", " Thanks.", " Thank you in advance.", " Please help.", " Kind regards."]
RESEND_PREFIXES = ["Any update? ", "Following up: ", "Sending this again: ", "Still waiting. "]
STOCK = [  # repeated verbatim across conversations: exact duplicates for the audit
    "Thanks, that solved it!",
    "Ok, I will wait for your email.",
    "Great, it works now. Thank you for the quick help.",
]
START = datetime(2024, 1, 1, tzinfo=UTC)
SPAN_DAYS = 182


def generate_tickets(seed: int = 0, n_conversations: int = 400) -> list[dict[str, Any]]:
    """All messages of `n_conversations` conversations, ordered by conversation then time."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for conv, queue in enumerate(_queue_plan(rng, n_conversations), start=1):
        rows.extend(_conversation(rng, conv, queue))
    return rows


def _queue_plan(rng: random.Random, n: int) -> list[str]:
    """Queues for n conversations in the declared shares exactly (largest remainders), in a
    shuffled order: the imbalance is a property of the demo, not of the seed."""
    counts = {q: int(share * n) for q, share in QUEUES.items()}
    by_remainder = sorted(QUEUES, key=lambda q: (counts[q] - QUEUES[q] * n, -QUEUES[q]))
    for q in by_remainder[: n - sum(counts.values())]:
        counts[q] += 1
    plan = [q for q, c in counts.items() for _ in range(c)]
    rng.shuffle(plan)
    return plan


def write_demo_data(folder: Path, seed: int = 0, n_conversations: int = 400) -> Path:
    """Write `folder/tickets.jsonl` (one message per line) and return its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tickets.jsonl"
    lines = [json.dumps(row, ensure_ascii=False) for row in generate_tickets(seed, n_conversations)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _conversation(rng: random.Random, conv: int, queue: str) -> list[dict[str, Any]]:
    """One conversation: the first message, then resends, new details and maybe a stock reply."""
    started = START + timedelta(seconds=rng.uniform(0, SPAN_DAYS * 86400))
    name = rng.choice(NAMES)
    values = {
        "order_id": f"ORD-{rng.randint(10000, 99999)}",
        "product": rng.choice(PRODUCTS),
        "amount": f"${rng.randint(5, 899)}.{rng.randint(0, 99):02d}",
        "date": (started - timedelta(days=rng.randint(1, 30))).date().isoformat(),
        "email": f"{name}.{rng.choice(NAMES)}{rng.randint(10, 9999)}@example.com",
        "code": f"E{rng.randint(100, 9999)}",
    }
    vague = rng.random() < VAGUE_SHARE
    first_body = rng.choice(VAGUE if vague else OPENERS[queue])
    greeting, sign_off = rng.choice(GREETINGS), rng.choice(SIGN_OFFS)
    first = _message(first_body, values, greeting, sign_off)
    messages = [first]
    n_more = rng.choices([0, 1, 2, 3], [0.3, 0.35, 0.25, 0.1])[0]
    prefixes = rng.sample(RESEND_PREFIXES, k=len(RESEND_PREFIXES))
    follow_ups = rng.sample(FOLLOW_UPS[queue], k=len(FOLLOW_UPS[queue]))
    for _ in range(n_more):
        kind = rng.choices(["resend", "follow_up", "stock"], [0.45, 0.4, 0.15])[0]
        if kind == "resend" and prefixes:
            # The same request again: a prefix, and sometimes another sign-off (near duplicate).
            other_sign_off = rng.choice(SIGN_OFFS) if rng.random() < 0.3 else sign_off
            messages.append(_message(first_body, values, prefixes.pop() + greeting, other_sign_off))
        elif kind == "follow_up" and follow_ups:
            messages.append(_message(follow_ups.pop(), values, "", rng.choice(SIGN_OFFS)))
        else:
            messages.append((rng.choice(STOCK), _no_fields()))
    rows = []
    moment = started
    for i, (text, fields) in enumerate(messages, start=1):
        rows.append(
            {
                "id": f"t-{conv:05d}-{i}",
                "conversation_id": f"c-{conv:05d}",
                "created_at": moment.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "queue": queue,
                "text": text,
                "fields": fields,
            }
        )
        moment += timedelta(minutes=rng.randint(10, 3 * 24 * 60))
    return rows


def _no_fields() -> dict[str, Any]:
    return {"order_id": None, "product": None, "amount": None, "date": None}


def _message(
    body: str, values: dict[str, str], greeting: str, sign_off: str
) -> tuple[str, dict[str, Any]]:
    """Fill a template; the target holds exactly the fields the text mentions, null otherwise."""
    text = body.format(**values)
    text = greeting + (text[0].upper() + text[1:] if not greeting else text) + "." + sign_off
    fields = _no_fields()
    for name in fields:
        if "{" + name + "}" in body:
            raw = values[name]
            fields[name] = float(raw.lstrip("$")) if name == "amount" else raw
    return text.replace("?.", "?"), fields
