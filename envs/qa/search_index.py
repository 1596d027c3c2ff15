"""The search env's corpus, questions and BM25 index, each built once per process.

:func:`load_corpus` and :func:`load_questions` read the user's JSONL files (or take
the generated world of :mod:`.search_world`), and :func:`get_index` builds a BM25
index over a corpus with `bm25s <https://pypi.org/project/bm25s/>`_. All three keep
their result in a module-level cache (files keyed by resolved path, modification
time and size), so every env of a process shares one corpus and one index, and a
reset only draws a question.

File formats (one JSON object a line, UTF-8):

* corpus (``corpus_path``): ``{"id": "p1", "title": "Ada Lovelace", "text": "..."}``;
  ``text`` is required, ``title`` defaults to "" and ``id`` to the line's number;
  ids must be unique. Whitespace runs in titles and texts become one space and
  unprintable characters are dropped.
* questions (``questions_path``): ``{"question": "...", "answer": "..."}``, where
  ``answer`` may also be a list of accepted answers; an optional ``hops`` lists the
  ids of the passages that hold the facts the answer needs, in order (only the
  demo's oracle reads it; unknown ids are an error).

The index scores ``title + ". " + text`` with BM25 (bm25s defaults: Lucene's
variant, k1=1.5, b=0.75), after bm25s's tokenizer (lower case, words of two or more
letters or digits, English stopwords removed; no stemming). A query is tokenized
the same way against the corpus vocabulary; words the corpus lacks are dropped, and
passages that match no query word are not returned.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .qa_data import file_key, read_jsonl
from .search_world import Passage, SearchQuestion, generate_world

_LOCK = threading.RLock()
_CORPORA: dict[Any, Corpus] = {}
_QUESTIONS: dict[Any, tuple[SearchQuestion, ...]] = {}
_INDEXES: dict[Any, SearchIndex] = {}
_GENERATED = ("generated",)


@dataclass(frozen=True, eq=False)
class Corpus:
    """Passages in index order, by id; ``key`` identifies the source in the caches."""

    key: Any
    passages: tuple[Passage, ...]
    position: Mapping[str, int] = field(repr=False)
    #: Every character of the titles and texts (the observation's charset adds them).
    charset: frozenset[str] = field(repr=False)

    def __getitem__(self, passage_id: str) -> Passage:
        return self.passages[self.position[passage_id]]


def _clean(text: str) -> str:
    return " ".join("".join(ch for ch in text if ch.isprintable() or ch.isspace()).split())


def _make_corpus(key: Any, passages: Sequence[Passage]) -> Corpus:
    charset = frozenset().union(*(frozenset(p.title + p.text) for p in passages))
    position = {p.id: i for i, p in enumerate(passages)}
    return Corpus(key, tuple(passages), position, charset)


@functools.cache
def _generated() -> tuple[list[Passage], list[SearchQuestion]]:
    return generate_world()


def load_corpus(corpus_path: Any = None) -> Corpus:
    """The corpus of ``corpus_path`` (JSONL), or the generated world's when None."""
    key = _GENERATED if corpus_path is None else file_key(corpus_path, "corpus_path")
    with _LOCK:
        if key not in _CORPORA:
            if corpus_path is None:
                passages = _generated()[0]
            else:
                passages = _read_passages(key[0])
            _CORPORA[key] = _make_corpus(key, passages)
        return _CORPORA[key]


def _read_passages(path: str) -> list[Passage]:
    passages, seen = [], set()
    for row, record in enumerate(read_jsonl(path, "corpus_path"), start=1):
        text, title, pid = record.get("text"), record.get("title", ""), record.get("id", row)
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"corpus_path={path!r}: record {row} needs a non-empty 'text' string")
        if not isinstance(title, str):
            raise ValueError(f"corpus_path={path!r}: record {row}'s 'title' is not a string")
        if not isinstance(pid, str | int) or isinstance(pid, bool):
            raise ValueError(f"corpus_path={path!r}: record {row}'s 'id' is not a string or int")
        pid = str(pid)
        if pid in seen:
            raise ValueError(f"corpus_path={path!r}: record {row} repeats the id {pid!r}")
        seen.add(pid)
        passages.append(Passage(pid, _clean(title), _clean(text)))
    if not passages:
        raise ValueError(f"corpus_path={path!r}: the file holds no passages")
    return passages


def load_questions(questions_path: Any, corpus: Corpus) -> tuple[SearchQuestion, ...]:
    """The questions of ``questions_path`` (JSONL), or the generated world's when None;
    ``hops`` are checked against ``corpus``."""
    source = _GENERATED if questions_path is None else file_key(questions_path, "questions_path")
    key = (source, corpus.key)
    with _LOCK:
        if key not in _QUESTIONS:
            if questions_path is None:
                questions = _generated()[1]
            else:
                questions = _read_questions(source[0])
            for row, question in enumerate(questions, start=1):
                unknown = [h for h in question.hops if h not in corpus.position]
                if unknown:
                    raise ValueError(
                        f"questions_path: question {row}'s hops name passages the corpus "
                        f"lacks: {unknown[:3]}"
                    )
            _QUESTIONS[key] = tuple(questions)
        return _QUESTIONS[key]


def _read_questions(path: str) -> list[SearchQuestion]:
    questions = []
    for row, record in enumerate(read_jsonl(path, "questions_path"), start=1):
        question, answer, hops = (
            record.get("question"),
            record.get("answer"),
            record.get("hops", []),
        )
        answers = [answer] if isinstance(answer, str) else answer
        where = f"questions_path={path!r}: record {row}"
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where} needs a non-empty 'question' string")
        if (
            not isinstance(answers, list)
            or not answers
            or not all(isinstance(a, str) and a.strip() for a in answers)
        ):
            raise ValueError(f"{where} needs an 'answer': a non-empty string or list of strings")
        if not isinstance(hops, list) or not all(isinstance(h, str | int) for h in hops):
            raise ValueError(f"{where}: 'hops' must be a list of passage ids")
        questions.append(
            SearchQuestion(_clean(question), tuple(answers), tuple(str(h) for h in hops))
        )
    if not questions:
        raise ValueError(f"questions_path={path!r}: the file holds no questions")
    return questions


def import_bm25s():
    """``bm25s`` on its NumPy backend. Imported with numba hidden unless something
    imported numba already: bm25s would import numba (and llvmlite) whenever it is
    installed, and vLLM's CPU build, which installs it, fails to start an engine in
    a process that has llvmlite loaded. The NumPy backend also needs no JIT warm-up."""
    if "bm25s" in sys.modules or "numba" in sys.modules:
        import bm25s
    else:
        sys.modules["numba"] = None  # type: ignore[assignment]  # ImportError on import
        try:
            import bm25s
        except ImportError as err:  # pragma: no cover - bm25s is a dependency
            raise ImportError(
                "the search env needs bm25s: pip install bm25s (it comes with ragen-rllib)"
            ) from err
        finally:
            del sys.modules["numba"]
    return bm25s


class SearchIndex:
    """A BM25 index (bm25s) over a corpus; build it through :func:`get_index`."""

    def __init__(self, corpus: Corpus) -> None:
        bm25s = import_bm25s()
        from bm25s.tokenization import Tokenized, Tokenizer

        self.corpus = corpus
        self.tokenizer = Tokenizer(stopwords="en")
        documents = [f"{p.title}. {p.text}" for p in corpus.passages]
        ids = self.tokenizer.tokenize(documents, update_vocab=True, show_progress=False)
        self.retriever = bm25s.BM25()
        self.retriever.index(
            Tokenized(ids=ids, vocab=self.tokenizer.get_vocab_dict()), show_progress=False
        )

    def search(self, query: str, k: int) -> list[tuple[Passage, float]]:
        """The (at most) ``k`` passages of highest BM25 score for ``query``, best first;
        only passages that share a word with the query."""
        ids = self.tokenizer.tokenize(
            [query], update_vocab=False, show_progress=False, allow_empty=False
        )[0]
        if not ids:
            return []
        k = min(k, len(self.corpus.passages))
        docs, scores = self.retriever.retrieve(
            [ids], k=k, show_progress=False, n_threads=0, backend_selection="numpy"
        )
        return [
            (self.corpus.passages[int(d)], float(s))
            for d, s in zip(docs[0], scores[0], strict=True)
            if s > 0
        ]


def get_index(corpus: Corpus) -> SearchIndex:
    """The BM25 index of ``corpus``, built at the first call for it in this process."""
    with _LOCK:
        if corpus.key not in _INDEXES:
            _INDEXES[corpus.key] = SearchIndex(corpus)
        return _INDEXES[corpus.key]
