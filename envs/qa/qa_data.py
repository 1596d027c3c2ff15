"""Question/answer files for the QA envs, read once per process.

:func:`read_records` reads a JSONL file (one JSON object a line, with the standard
library; a ``.json`` file may instead hold one JSON array of objects, as MetaMathQA's
release does) or a Parquet file (with pyarrow) into a list of dicts; :func:`load_qa_dataset`
turns one into a :class:`QADataset` of questions and gold final answers, and keeps it
in a module-level cache keyed by the file's resolved path, modification time and size
(and the field names and answer format): every env of a process shares one copy, and
an edited file is read again. Without a path it serves the generated arithmetic word
problems of :mod:`.word_problems`.

Every problem with a file raises :class:`ValueError` naming the keyword argument
to fix (``path``, ``question_field``, ``answer_field``, ``answer_format``), so that
the message reaches the user through the trainer's config check, which makes and
resets each env.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .qa_answers import clean_answer, extract_final_answer, last_boxed
from .word_problems import generate_word_problems

#: How the gold answer is read from the answer field (the ``answer_format`` kwarg).
ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "plain")
#: Field names tried, in order, when ``question_field`` / ``answer_field`` are not given:
#: GSM8K's, MetaMathQA's, MATH's.
QUESTION_FIELDS = ("question", "query", "problem")
ANSWER_FIELDS = ("answer", "response", "solution")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
PARQUET_SUFFIXES = (".parquet", ".pq")

_CACHE: dict[tuple, QADataset] = {}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class QADataset:
    """Questions and their gold final answers, plus what an env needs to bound its
    observations: every character the questions use and the longest question."""

    source: str
    questions: tuple[str, ...]
    answers: tuple[str, ...]
    charset: frozenset[str]
    max_question_length: int

    def __len__(self) -> int:
        return len(self.questions)


def file_key(path: Any, kwarg: str) -> tuple[str, int, int]:
    """(resolved path, mtime in ns, size) of an existing file; ValueError naming ``kwarg``."""
    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ValueError(f"{kwarg} must be a path to a file, got {path!r}")
    real = os.path.realpath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(real):
        raise ValueError(f"{kwarg}={os.fspath(path)!r}: no such file")
    stat = os.stat(real)
    return real, stat.st_mtime_ns, stat.st_size


def read_jsonl(path: str, kwarg: str) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one a line (blank lines skipped); a ``.json``
    file that opens with ``[`` is read as one JSON array of objects instead."""
    records = []
    try:
        with open(path, encoding="utf-8-sig") as handle:
            if path.lower().endswith(".json") and handle.read(64).lstrip().startswith("["):
                handle.seek(0)
                return _json_array(json.load(handle), path, kwarg)
            handle.seek(0)
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(
                        f"{kwarg}={path!r}: line {number} is not valid JSON ({err.msg})"
                    ) from None
                if not isinstance(record, dict):
                    raise ValueError(
                        f"{kwarg}={path!r}: line {number} is a JSON {type(record).__name__}, "
                        "not an object"
                    )
                records.append(record)
    except json.JSONDecodeError as err:  # the JSON array
        raise ValueError(f"{kwarg}={path!r}: not valid JSON ({err})") from None
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{kwarg}={path!r}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None
    return records


def _json_array(data: Any, path: str, kwarg: str) -> list[dict[str, Any]]:
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise ValueError(f"{kwarg}={path!r}: a JSON file must hold an array of objects")
    return data


def read_parquet(path: str, kwarg: str, columns: Sequence[str] | None = None) -> list[dict]:
    """The rows of a Parquet file as dicts (only ``columns`` when given)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=list(columns) if columns else None)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several kinds
        raise ValueError(f"{kwarg}={path!r}: not a readable Parquet file ({err})") from None
    return table.to_pylist()


def parquet_fields(path: str, kwarg: str) -> list[str]:
    """The column names of a Parquet file."""
    import pyarrow.parquet as pq

    try:
        return list(pq.read_schema(path).names)
    except Exception as err:  # noqa: BLE001
        raise ValueError(f"{kwarg}={path!r}: not a readable Parquet file ({err})") from None


def is_parquet(path: str, kwarg: str) -> bool:
    """True for a Parquet file, False for JSONL, by the file name's suffix."""
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return True
    if lower.endswith(JSONL_SUFFIXES):
        return False
    raise ValueError(
        f"{kwarg}={path!r}: the file name must end in one of "
        f"{list(JSONL_SUFFIXES + PARQUET_SUFFIXES)} (JSONL or Parquet)"
    )


def read_records(path: str, kwarg: str, columns: Sequence[str] | None = None) -> list[dict]:
    """The records of a JSONL or Parquet file; an empty file is an error."""
    records = (
        read_parquet(path, kwarg, columns) if is_parquet(path, kwarg) else read_jsonl(path, kwarg)
    )
    if not records:
        raise ValueError(f"{kwarg}={path!r}: the file holds no records")
    return records


def pick_field(given: Any, present: Iterable[str], candidates: Sequence[str], kwarg: str) -> str:
    """``given`` when it is a field the file has, else the first of ``candidates`` it has."""
    present = list(present)
    if given is not None:
        if not isinstance(given, str) or not given:
            raise ValueError(f"{kwarg} must be a field name (str), got {given!r}")
        if given not in present:
            raise ValueError(f"{kwarg}={given!r}: the file has no such field; it has {present}")
        return given
    for name in candidates:
        if name in present:
            return name
    raise ValueError(
        f"{kwarg} is not set and the file has none of {list(candidates)}; it has {present}: "
        f"set {kwarg}"
    )


def as_text(value: Any, kwarg: str, field: str, row: int) -> str:
    """A field value as text: strings as they are, numbers written out."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):  # 42.0 (a float column) is 42
        return str(int(value)) if value.is_integer() else repr(value)
    raise ValueError(
        f"{kwarg}={field!r}: record {row} holds {type(value).__name__} {value!r:.60}, not text"
    )


def gold_answer(text: str, answer_format: str) -> str:
    """The final answer in a gold answer field, read by ``answer_format``; "" if none."""
    if answer_format == "plain":
        return text.strip()
    if answer_format == "gsm8k":
        at = text.rfind("####")
        return "" if at < 0 else clean_answer(text[at + 4 :].split("\n", 1)[0])
    if answer_format == "boxed":
        boxed = last_boxed(text)
        return "" if boxed is None else boxed.strip()
    return extract_final_answer(text)


def _build(
    source: str, pairs: Iterable[tuple[str, str]], answer_format: str, field: str
) -> QADataset:
    questions, answers = [], []
    for row, (question, answer) in enumerate(pairs, start=1):
        gold = gold_answer(answer, answer_format)
        if not question.strip():
            raise ValueError(f"question_field: record {row} of {source} has an empty question")
        if not gold:
            raise ValueError(
                f"answer_format={answer_format!r}: no final answer found in record {row}'s "
                f"{field!r} ({answer[-60:]!r}); see ANSWER_FORMATS"
            )
        questions.append(question.strip())
        answers.append(gold)
    charset = frozenset().union(*map(frozenset, questions))
    return QADataset(
        source=source,
        questions=tuple(questions),
        answers=tuple(answers),
        charset=charset,
        max_question_length=max(map(len, questions)),
    )


def load_qa_dataset(
    path: Any = None,
    question_field: str | None = None,
    answer_field: str | None = None,
    answer_format: str = "auto",
) -> QADataset:
    """The dataset at ``path`` (JSONL or Parquet), or the generated word problems when
    ``path`` is None; read once per process and file version (see the module docstring)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"answer_format must be one of {list(ANSWER_FORMATS)}, got {answer_format!r}"
        )
    if path is None:
        key: tuple = ("generated", answer_format)
    else:
        key = (file_key(path, "path"), question_field, answer_field, answer_format)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        if path is None:
            records = generate_word_problems()
            pairs = [(r["question"], r["answer"]) for r in records]
            dataset = _build("the generated word problems", pairs, answer_format, "answer")
        else:
            dataset = _load_file(key[0][0], question_field, answer_field, answer_format)
        _CACHE[key] = dataset
        return dataset


def _load_file(path: str, question_field: Any, answer_field: Any, answer_format: str) -> QADataset:
    if is_parquet(path, "path"):
        present = parquet_fields(path, "path")
        q_field = pick_field(question_field, present, QUESTION_FIELDS, "question_field")
        a_field = pick_field(answer_field, present, ANSWER_FIELDS, "answer_field")
        records = read_records(path, "path", columns=[q_field, a_field])
    else:
        records = read_records(path, "path")
        q_field = pick_field(question_field, records[0], QUESTION_FIELDS, "question_field")
        a_field = pick_field(answer_field, records[0], ANSWER_FIELDS, "answer_field")
    pairs = []
    for row, record in enumerate(records, start=1):
        for kwarg, name in (("question_field", q_field), ("answer_field", a_field)):
            if name not in record:
                raise ValueError(f"{kwarg}={name!r}: record {row} of {path!r} has no such field")
        pairs.append(
            (
                as_text(record[q_field], "question_field", q_field, row),
                as_text(record[a_field], "answer_field", a_field, row),
            )
        )
    return _build(repr(path), pairs, answer_format, a_field)
