"""The shipped search corpus: a generated world of countries, cities, people and companies.

:func:`generate_world` invents, from a :class:`random.Random` of a fixed seed (the
same world on every machine, no download), 24 countries, 160 cities, 480 people and
120 companies, with facts that link them: every city lies in a country, every country
has a capital, every person was born in a city, every company was founded by a person
and has its headquarters in a city. Each entity gets one passage (784 in all) that
states its own facts only, so a question about a chain of facts needs one search per
link.

Questions come from those facts, one hop (the answer is in the passage of the entity
the question names) or two hops (that passage names another entity, whose passage
holds the answer):

* one hop: "Where was X born?", "In which country is the city of C?", "What is the
  capital of K?", "Who founded Y?", "In which city is Y headquartered?";
* two hops: "In which country was X born?", "In which city was the founder of Y
  born?", "In which country is Y headquartered?".

Each question records the passages of its chain (``hops``), which the demo's oracle
searches for by title. Names are made of random syllables and share words the way
real names do, so that BM25 must rank the passage with all of a name's words first:
first and family names are shared between people, a quarter of the family names are
city names ("Leo Karsk" beside the city of Karsk), half the companies carry a family
name ("Karsk Motors"), and rivers and industries recur.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

WORLD_SEED = 1234
NUM_COUNTRIES, NUM_CITIES, NUM_PEOPLE, NUM_COMPANIES = 24, 160, 480, 120
#: Questions kept of each kind of hop count (drawn from all the facts).
QUESTIONS_PER_HOP_COUNT = 600

_ONSETS = "b br d dr f g gr h k kr l m n p r s st t tr v z th sh".split()
_VOWELS = "a e i o u ae ia ou ei".split()
_CODAS = ["", "", "n", "r", "l", "s", "th", "m", "k"]
_PROFESSIONS = (
    "painter", "engineer", "novelist", "chemist", "architect", "violinist", "economist",
    "botanist", "journalist", "surgeon", "astronomer", "sculptor",
)  # fmt: skip
#: Company name word -> what the company does.
_INDUSTRIES = {
    "Textiles": "textile", "Motors": "car", "Foods": "food", "Labs": "research",
    "Shipping": "shipping", "Mining": "mining", "Press": "publishing", "Software": "software",
    "Glassworks": "glass", "Pharma": "drug", "Energy": "energy", "Airlines": "airline",
}  # fmt: skip
_CITY_SUFFIXES = ("", "", "", "burg", "ford", "holm", "vik", "port", "dale")
_COUNTRY_SUFFIXES = ("ia", "land", "mora", "istan", "ora")


@dataclass(frozen=True)
class Passage:
    """One retrievable passage: a unique id, a title (the entity's name) and its text."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class SearchQuestion:
    """A question, its accepted answers, and the passages of its chain (may be empty)."""

    question: str
    answers: tuple[str, ...]
    hops: tuple[str, ...] = ()
    kind: str = ""


def _a(word: str) -> str:
    """``word`` with its indefinite article."""
    return ("an " if word[0] in "aeiou" else "a ") + word


class _Names:
    """Random pronounceable names, no word used by two kinds of name."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.used: set[str] = set()

    def word(self, syllables: int, suffixes: tuple[str, ...] = ("",)) -> str:
        while True:
            parts = [self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) for _ in range(syllables)]
            name = ("".join(parts) + self.rng.choice(_CODAS) + self.rng.choice(suffixes)).title()
            if name.lower() not in self.used and len(name) >= 4:
                self.used.add(name.lower())
                return name

    def words(self, count: int, syllables: int, suffixes: tuple[str, ...] = ("",)) -> list[str]:
        return [self.word(syllables, suffixes) for _ in range(count)]


def _people(rng: random.Random, names: _Names, cities: list[str]) -> tuple[list[str], list[str]]:
    """People's full names, unique, and the family names they use (some are city names)."""
    firsts = names.words(70, 2)
    lasts = names.words(70, 2) + names.words(20, 3) + rng.sample(cities, 30)
    people: list[str] = []
    taken: set[str] = set()
    while len(people) < NUM_PEOPLE:
        name = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if name not in taken:
            taken.add(name)
            people.append(name)
    return people, lasts


def generate_world(seed: int = WORLD_SEED) -> tuple[list[Passage], list[SearchQuestion]]:
    """The passages and the questions of the generated world of ``seed``."""
    rng = random.Random(seed)
    names = _Names(rng)
    countries = names.words(NUM_COUNTRIES, 2, _COUNTRY_SUFFIXES)
    languages = names.words(NUM_COUNTRIES, 2, ("ish", "ese", "ic"))
    rivers = names.words(40, 2)
    cities = names.words(NUM_CITIES, 2, _CITY_SUFFIXES)
    people, family_names = _people(rng, names, cities)
    stems = names.words(NUM_COMPANIES // 2, 2) + rng.sample(family_names, NUM_COMPANIES // 2)
    companies = [f"{stem} {rng.choice(sorted(_INDUSTRIES))}" for stem in stems]

    # Facts: every country gets at least one city, its first one is the capital.
    country_of = {city: countries[i % NUM_COUNTRIES] for i, city in enumerate(cities)}
    capital = {country: cities[i] for i, country in enumerate(countries)}
    born_in = {person: rng.choice(cities) for person in people}
    founder = {company: rng.choice(people) for company in companies}
    hq = {company: rng.choice(cities) for company in companies}

    passages: list[Passage] = []
    pid: dict[str, str] = {}

    def add(kind: str, name: str, text: str) -> None:
        pid[name] = f"{kind}-{len(passages)}"
        passages.append(Passage(pid[name], name, text))

    for i, country in enumerate(countries):
        add(
            "country",
            country,
            f"{country} is a country whose capital is {capital[country]}. Its official "
            f"language is {languages[i]} and it has about {rng.randint(1, 90)} million "
            "inhabitants.",
        )
    for city in cities:
        role = " It is the capital of the country." if capital[country_of[city]] == city else ""
        add(
            "city",
            city,
            rng.choice(
                (
                    f"{city} is a city in {country_of[city]}, on the {rng.choice(rivers)} "
                    f"river. It was founded in {rng.randint(900, 1800)}.{role}",
                    f"Founded in {rng.randint(900, 1800)}, {city} lies on the "
                    f"{rng.choice(rivers)} river in {country_of[city]}.{role}",
                )
            ),
        )
    for person in people:
        year, job = rng.randint(1900, 2000), rng.choice(_PROFESSIONS)
        add(
            "person",
            person,
            rng.choice(
                (
                    f"{person} (born {year}) is {_a(job)} who was born in {born_in[person]}.",
                    f"Born in {born_in[person]} in {year}, {person} is {_a(job)}.",
                    f"{person} is {_a(job)}, born in {year} in the city of {born_in[person]}.",
                )
            ),
        )
    for company in companies:
        year, trade = rng.randint(1850, 2020), _INDUSTRIES[company.split()[-1]]
        add(
            "company",
            company,
            rng.choice(
                (
                    f"{company} is {_a(trade)} company founded in {year} by {founder[company]}. "
                    f"Its headquarters are in {hq[company]}.",
                    f"{founder[company]} founded {company} in {year}. The company has "
                    f"its headquarters in {hq[company]}.",
                )
            ),
        )

    def ask(kind: str, question: str, answer: str, chain: list[str]) -> SearchQuestion:
        return SearchQuestion(question, (answer,), tuple(pid[name] for name in chain), kind)

    one_hop = [ask("birthplace", f"Where was {p} born?", born_in[p], [p]) for p in people]
    one_hop += [
        ask("city_country", f"In which country is the city of {c}?", country_of[c], [c])
        for c in cities
    ]
    one_hop += [ask("capital", f"What is the capital of {k}?", capital[k], [k]) for k in countries]
    one_hop += [ask("founder", f"Who founded {co}?", founder[co], [co]) for co in companies]
    one_hop += [
        ask("headquarters", f"In which city is {co} headquartered?", hq[co], [co])
        for co in companies
    ]
    two_hop = [
        ask(
            "birth_country",
            f"In which country was {p} born?",
            country_of[born_in[p]],
            [p, born_in[p]],
        )
        for p in people
    ]
    # Two hops through a company: (kind, question, answer, the passage between).
    for kind, question, answer, via in (
        ("founder_birthplace", "In which city was the founder of {} born?",
         lambda co: born_in[founder[co]], founder),
        ("headquarters_country", "In which country is {} headquartered?",
         lambda co: country_of[hq[co]], hq),
    ):  # fmt: skip
        two_hop += [ask(kind, question.format(co), answer(co), [co, via[co]]) for co in companies]
    rng.shuffle(one_hop)
    rng.shuffle(two_hop)
    questions = one_hop[:QUESTIONS_PER_HOP_COUNT] + two_hop[:QUESTIONS_PER_HOP_COUNT]
    return passages, questions
