"""The shipped arithmetic word problems: generated in code, the same on every machine.

:func:`generate_word_problems` fills a dozen sentence templates with names, objects
and numbers drawn from a :class:`random.Random` of a fixed seed, so the set needs no
download and no data file, and is identical in every process. Each problem takes one
to three operations (+, -, x, exact /) and its answer is a non-negative integer. The
records are GSM8K-shaped: ``question``, and ``answer`` with a short worked solution
that ends in the line ``#### <number>``.
"""

from __future__ import annotations

import random
from collections.abc import Callable

#: How many problems :func:`generate_word_problems` makes by default, and its seed.
GENERATED_SIZE = 1000
GENERATED_SEED = 20240611

_NAMES = (
    "Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jamal",
    "Kira", "Leo", "Maya", "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara",
)  # fmt: skip
_THINGS = (
    "apples", "marbles", "stickers", "pencils", "cookies", "stamps", "shells", "cards",
    "books", "coins", "beads", "tickets",
)  # fmt: skip
_Problem = tuple[str, list[str], int]


def _buy_more(r: random.Random, name: str, thing: str) -> _Problem:
    have, packs, each = r.randint(3, 60), r.randint(2, 9), r.randint(2, 12)
    answer = have + packs * each
    question = (
        f"{name} has {have} {thing}. {name} buys {packs} packs with {each} {thing} in each "
        f"pack. How many {thing} does {name} have now?"
    )
    return question, [f"{packs} * {each} = {packs * each}", f"{have} + {packs * each}"], answer


def _give_away(r: random.Random, name: str, thing: str) -> _Problem:
    gave, friends = r.randint(2, 15), r.randint(2, 6)
    have = gave * friends + r.randint(0, 40)
    answer = have - gave * friends
    question = (
        f"{name} had {have} {thing} and gave {gave} to each of {friends} friends. How many "
        f"{thing} does {name} have left?"
    )
    return (
        question,
        [f"{gave} * {friends} = {gave * friends}", f"{have} - {gave * friends}"],
        answer,
    )


def _share(r: random.Random, name: str, thing: str) -> _Problem:
    people, each = r.randint(2, 12), r.randint(2, 25)
    total = people * each
    question = (
        f"{name} shares {total} {thing} equally among {people} children. How many {thing} "
        "does each child get?"
    )
    return question, [f"{total} / {people}"], each


def _weekly(r: random.Random, name: str, thing: str) -> _Problem:
    per_day, days, weeks = r.randint(2, 20), r.randint(2, 7), r.randint(2, 8)
    answer = per_day * days * weeks
    question = (
        f"{name} collects {per_day} {thing} a day, {days} days a week. How many {thing} "
        f"does {name} collect in {weeks} weeks?"
    )
    return (
        question,
        [f"{per_day} * {days} = {per_day * days}", f"{per_day * days} * {weeks}"],
        answer,
    )


def _price(r: random.Random, name: str, thing: str) -> _Problem:
    price, count, paid_extra = r.randint(2, 30), r.randint(2, 12), r.randint(0, 50)
    cost = price * count
    paid = cost + paid_extra
    question = (
        f"{thing.capitalize()} cost ${price} each. {name} buys {count} of them and pays with "
        f"${paid}. How many dollars of change does {name} get?"
    )
    return question, [f"{price} * {count} = {cost}", f"{paid} - {cost}"], paid - cost


def _two_friends(r: random.Random, name: str, thing: str) -> _Problem:
    other = _NAMES[(_NAMES.index(name) + r.randint(1, len(_NAMES) - 1)) % len(_NAMES)]
    mine, times = r.randint(3, 40), r.randint(2, 5)
    theirs = mine * times
    question = (
        f"{name} has {mine} {thing}. {other} has {times} times as many {thing} as {name}. "
        f"How many {thing} do they have together?"
    )
    return question, [f"{mine} * {times} = {theirs}", f"{mine} + {theirs}"], mine + theirs


def _boxes_left(r: random.Random, name: str, thing: str) -> _Problem:
    boxes, per_box, used = r.randint(2, 10), r.randint(4, 24), r.randint(1, 30)
    total = boxes * per_box
    used = min(used, total)
    question = (
        f"{name} has {boxes} boxes of {thing} with {per_box} in each box and uses {used} of "
        f"them. How many {thing} are left?"
    )
    return question, [f"{boxes} * {per_box} = {total}", f"{total} - {used}"], total - used


def _half(r: random.Random, name: str, thing: str) -> _Problem:
    start = 2 * r.randint(5, 60)
    found = r.randint(1, 30)
    answer = start // 2 + found
    question = (
        f"{name} had {start} {thing} and lost half of them. Then {name} found {found} more. "
        f"How many {thing} does {name} have now?"
    )
    return question, [f"{start} / 2 = {start // 2}", f"{start // 2} + {found}"], answer


def _rows(r: random.Random, name: str, thing: str) -> _Problem:
    rows, per_row, missing = r.randint(2, 12), r.randint(2, 15), r.randint(0, 9)
    total = rows * per_row
    missing = min(missing, total)
    question = (
        f"{name} lays out {thing} in {rows} rows of {per_row}, but {missing} places stay "
        f"empty. How many {thing} are laid out?"
    )
    return question, [f"{rows} * {per_row} = {total}", f"{total} - {missing}"], total - missing


def _savings(r: random.Random, name: str, thing: str) -> _Problem:
    price, saved, per_week = r.randint(20, 200), r.randint(0, 19), r.randint(1, 10)
    weeks = -(-(price - saved) // per_week)
    question = (
        f"A set of {thing} costs ${price}. {name} has saved ${saved} and saves ${per_week} "
        f"more each week. How many weeks until {name} can buy the set?"
    )
    return question, [f"({price} - {saved}) / {per_week}, rounded up"], weeks


def _total_three(r: random.Random, name: str, thing: str) -> _Problem:
    a, b, c = r.randint(1, 99), r.randint(1, 99), r.randint(1, 99)
    question = (
        f"On Monday {name} counted {a} {thing}, on Tuesday {b} and on Wednesday {c}. How "
        f"many {thing} did {name} count in all?"
    )
    return question, [f"{a} + {b} + {c}"], a + b + c


def _difference(r: random.Random, name: str, thing: str) -> _Problem:
    a = r.randint(20, 500)
    b = r.randint(1, a)
    question = (
        f"A shop had {a} {thing} in the morning and {b} in the evening. How many {thing} "
        "did it sell during the day?"
    )
    return question, [f"{a} - {b}"], a - b


_TEMPLATES: tuple[Callable[[random.Random, str, str], _Problem], ...] = (
    _buy_more, _give_away, _share, _weekly, _price, _two_friends,
    _boxes_left, _half, _rows, _savings, _total_three, _difference,
)  # fmt: skip


def generate_word_problems(
    size: int = GENERATED_SIZE, seed: int = GENERATED_SEED
) -> list[dict[str, str]]:
    """``size`` GSM8K-shaped records ``{"question", "answer"}``, the same for the same
    arguments on every machine (templates taken in turn, numbers drawn from ``seed``)."""
    rng = random.Random(seed)
    records = []
    for i in range(size):
        template = _TEMPLATES[i % len(_TEMPLATES)]
        question, steps, answer = template(rng, rng.choice(_NAMES), rng.choice(_THINGS))
        records.append({"question": question, "answer": "\n".join([*steps, f"#### {answer}"])})
    return records
