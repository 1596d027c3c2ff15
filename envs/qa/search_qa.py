"""Question answering with a search tool: the agent queries a BM25 index, then answers.

The first env of the project in which the agent calls a tool, and the pattern to copy
for your own tools: a command word and its argument inside ``<answer>``, one command
a turn, the tool's output in the next observation.

Each reset draws a question (:mod:`.search_world` generates a world of countries,
cities, people and companies and asks one- and two-hop questions about it; or your
own files, :mod:`.search_index`). Each turn the agent writes one command:

* ``<answer>search: Ilsa Marrow</answer>``: the ``top_k`` (default 3) passages of
  highest BM25 score for the query are shown in the next observation, best first,
  each cut to ``passage_max_chars`` characters; it spends one of ``max_searches``;
* ``<answer>answer: Karsk</answer>``: the final answer; the episode ends.

The command word is read case-insensitively up to the first colon; anything else
(no colon, another word, an empty query or answer, a search when none is left) is
refused with the format penalty and a message saying why, and spends nothing. Each
search and the answer spend one of the episode's ``max_searches + 1`` actions. As in
Countdown, unreadable answers leave the episode open: the trainer's turn limit bounds
it (set ``max_turns`` for a limit of the env's own).

Reward 1.0 (success) when the answer equals one of the question's answers once both
are normalised (:func:`.qa_answers.normalize_text`: lower case, no punctuation, no
articles, single spaces), else 0. ``info`` carries ``searches`` (made so far),
``searches_left`` and ``retrieved`` (the ids of the passages this turn showed).

The passages are trusted corpus text and are shown as they are (whitespace runs
made one space, cut to length); the observation's charset adds the corpus's
characters to printable ASCII. The query echoed back is model text: it goes
through :func:`.answer_env.quote` (cut to 60 characters, other characters made ``?``).
The corpus, the questions and the index are built once per process and shared by
every env (:func:`.search_index.get_index`); a reset only draws a question.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.answer_env import OBS_CHARSET, AnswerEnv, AnswerResult, quote
from .qa_answers import normalize_text
from .search_index import Corpus, SearchIndex, get_index, load_corpus, load_questions
from .search_world import SearchQuestion

CORRECT_REWARD = 1.0
COMMANDS = ("search", "answer")
_TITLE_MAX = 80
_QUESTION = "Question: "


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)].rstrip() + "..."


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return value


class SearchQAEnv(AnswerEnv):
    """Answer a question by searching a passage corpus with BM25.

    Args:
        corpus_path: a JSONL file of passages (see :mod:`.search_index`); None: the
            generated world (784 passages).
        questions_path: a JSONL file of questions with answers; None: the generated
            world's 1200 questions (the generated corpus's, so give both paths or
            neither unless your questions are about the generated world).
        top_k: passages shown per search.
        max_searches: searches per episode; the action budget is one more (the answer).
        passage_max_chars: each shown passage's text is cut to this length.
        hops: keep only the questions of this many hops (1 or 2; None: all). User
            questions without ``hops`` count as neither.
        **kwargs: passed to :class:`AnswerEnv` / :class:`TextEnv`.
    """

    open_vocabulary = True
    answer_example = "search: Ilsa Marrow"
    turn_info_defaults = {"retrieved": ()}

    def __init__(
        self,
        corpus_path: Any = None,
        questions_path: Any = None,
        top_k: int = 3,
        max_searches: int = 4,
        passage_max_chars: int = 300,
        hops: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.top_k = _int_in("top_k", top_k, 1, 20)
        self.max_searches = _int_in("max_searches", max_searches, 0, 50)
        self.passage_max_chars = _int_in("passage_max_chars", passage_max_chars, 20, 5000)
        if hops is not None:
            _int_in("hops", hops, 1, 10)
        self.corpus: Corpus = load_corpus(corpus_path)
        questions = load_questions(questions_path, self.corpus)
        if hops is not None:
            questions = tuple(q for q in questions if len(q.hops) == hops)
            if not questions:
                raise ValueError(f"hops={hops}: no question has {hops} hops")
        self.questions: tuple[SearchQuestion, ...] = questions
        self.index: SearchIndex = get_index(self.corpus)
        self.obs_charset = "".join(sorted(set(OBS_CHARSET) | self.corpus.charset | self._q_chars()))
        result_line = 8 + _TITLE_MAX + 3 + self.passage_max_chars
        longest = max(len(q.question) for q in self.questions)
        self.state_max_length = self.top_k * result_line + len(_QUESTION) + longest + 80
        kwargs.setdefault("action_budget", self.max_searches + 1)
        kwargs.setdefault("feedback_max_length", 200)
        super().__init__(**kwargs)
        self.question = self.questions[0]
        self.seen: set[str] = set()  # ids of the passages shown this episode
        self._results: list[tuple[str, str]] = []
        self._searches = 0
        self._solved = False
        self._wanted: int | None = None

    def _q_chars(self) -> set[str]:
        return set().union(*(set(q.question) for q in self.questions))

    @property
    def searches(self) -> int:
        """Searches made this episode."""
        return self._searches

    @property
    def searches_left(self) -> int:
        return self.max_searches - self._searches

    # ----- episode ------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``options={"index": i}`` asks the i-th question instead of a seeded draw."""
        wanted = (options or {}).get("index")
        if wanted is not None:
            _int_in("options['index']", wanted, 0, len(self.questions) - 1)
        self._wanted = wanted
        return super().reset(seed=seed, options=options)

    def _new_episode(self) -> None:
        drawn = int(self.np_random.integers(len(self.questions)))
        self.question = self.questions[drawn if self._wanted is None else self._wanted]
        self.seen = set()
        self._results = []
        self._searches = 0
        self._solved = False

    def _well_formed_body(self, answer: str) -> bool:
        """``search: <query>`` or ``answer: <text>``, with something after the colon."""
        word, colon, argument = answer.partition(":")
        return bool(colon) and word.strip().lower() in COMMANDS and bool(argument.split())

    def random_actions(self, rng: np.random.Generator) -> list[str]:
        """``search:`` or ``answer:`` (even odds) with a random passage's title."""
        title = self.corpus.passages[int(rng.integers(len(self.corpus.passages)))].title
        return [f"{'search' if rng.random() < 0.5 else 'answer'}: {title}"]

    def _is_success(self) -> bool:
        return self._solved

    def _extra_info(self) -> dict[str, Any]:
        return {"searches": self._searches, "searches_left": self.searches_left}

    # ----- one command ----------------------------------------------------------------
    def _judge(self, answer: str) -> AnswerResult:
        word, colon, argument = answer.partition(":")
        command = word.strip().lower()
        argument = " ".join(argument.split())
        if not colon or command not in COMMANDS:
            return self._refuse(answer, "Start with 'search:' or 'answer:'.")
        if not argument:
            return self._refuse(answer, f"Nothing after '{command}:'.")
        if command == "answer":
            return self._answer(argument)
        if self.searches_left <= 0:
            return self._refuse(answer, "No searches left: answer with 'answer: ...'.")
        return self._search(argument)

    def _refuse(self, answer: str, why: str) -> AnswerResult:
        self._results = []
        return AnswerResult(feedback=f"Refused: {why}", rejected=(answer,))

    def _search(self, query: str) -> AnswerResult:
        hits = self.index.search(query, self.top_k)
        self._searches += 1
        self._results = [(p.title, p.text) for p, _ in hits]
        self.seen.update(p.id for p, _ in hits)
        shown = quote(query, 60)
        if hits:
            feedback = f'Search {self._searches} for "{shown}": {len(hits)} passages.'
        else:
            feedback = f'Search {self._searches} for "{shown}": no passage matches.'
        return AnswerResult(
            feedback=feedback,
            executed=(f"search: {query[:60]}",),
            info={"retrieved": tuple(p.id for p, _ in hits)},
        )

    def _answer(self, text: str) -> AnswerResult:
        self._results = []
        given = normalize_text(text)
        self._solved = bool(given) and any(
            given == normalize_text(a) for a in self.question.answers
        )
        if self._solved:
            feedback = f"{quote(text, 60)} is correct!"
        else:
            feedback = (
                f"{quote(text, 60)} is not the answer ({quote(self.question.answers[0], 60)})."
            )
        return AnswerResult(
            reward=CORRECT_REWARD if self._solved else 0.0,
            feedback=feedback,
            executed=(f"answer: {text[:60]}",),
            terminated=True,
        )

    # ----- text ----------------------------------------------------------------------
    def _render_state(self) -> str:
        lines = [
            f"[{i}] {_cut(title, _TITLE_MAX)} | {_cut(text, self.passage_max_chars)}"
            for i, (title, text) in enumerate(self._results, start=1)
        ]
        lines.append(_QUESTION + self.question.question)
        lines.append(f"Searches left: {self.searches_left}. Next: search: ... or answer: ...")
        return "\n".join(lines)

    def _compact_instructions(self) -> str:
        return (
            "Find the answer with searches, then give it. "
            f"Commands: {self.answer_example} or answer: Karsk"
        )

    def _full_instructions(self) -> str:
        return (
            "Answer the question with the help of a search engine over a collection of "
            "encyclopedia passages. The facts you need are in the passages, not in your "
            "memory; a question may need two searches, the second for a name the first "
            "passage gives. Each turn, write exactly one command in the answer block:\n"
            f"- {self.parser.wrap(self.answer_example)} shows the {self.top_k} passages that "
            "best match the query (keyword search: use names and key words);\n"
            f"- {self.parser.wrap('answer: Karsk')} gives your final answer, a short name, and "
            "ends the episode.\n"
            f"You have {self.max_searches} searches and {self.action_budget} commands in "
            "all. Reward 1 when the answer is right (case and punctuation do not matter)."
        )


def oracle_command(env: SearchQAEnv) -> str:
    """The next command of an oracle that knows the question's chain of passages
    (``hops``): one search per link, for the passage's title, skipping passages already
    shown; once every passage of the chain has been shown it answers the gold answer
    (which the last one states). When a search misses its passage the oracle gives up
    ("answer: unknown", a failure), so its success rate is the share of questions whose
    whole chain BM25 finds by title within ``top_k``. A question without ``hops`` is
    answered at once."""
    for step, passage_id in enumerate(env.question.hops):
        if passage_id in env.seen:
            continue
        if env.searches <= step and env.searches_left > 0:
            return f"search: {env.corpus[passage_id].title}"
        return "answer: unknown"
    return f"answer: {env.question.answers[0]}"
