"""The dataset QA env (ragen/MathWordProblems-v0): final-answer extraction and number
matching (right values, bounded work on hostile text), JSONL and Parquet loading with
any field names, errors that name the keyword argument, the once-per-process cache,
seeded draws, single-turn and multi-turn play."""

from __future__ import annotations

import json
import os
import time
from fractions import Fraction

import gymnasium as gym
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.qa.dataset_qa import DatasetQAEnv
from ragen_envs.qa.qa_answers import answers_match, extract_final_answer, parse_number
from ragen_envs.qa.qa_data import load_qa_dataset
from ragen_envs.qa.word_problems import GENERATED_SIZE, generate_word_problems


def answer(body: str) -> str:
    return f"<think>t</think><answer>{body}</answer>"


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


# ----- extraction -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, final",
    [
        ("42", "42"),
        ("  42.  ", "42"),
        ("so \\boxed{\\frac{3}{4}} it is", "\\frac{3}{4}"),
        ("\\boxed{{1}+{2}} is \\boxed{\\frac{{7}}{2}}", "\\frac{{7}}{2}"),  # the last one
        ("\\fbox{-5}", "-5"),
        ("\\boxed{}", ""),
        ("\\boxed{12 but never closed #### 5", "5"),  # unclosed: later rules apply
        ("Step 1\nStep 2\n#### 1,234\nthanks", "1,234"),
        ("The answer is: 18.", "18"),
        ("so THE ANSWER IS 7\nwhy: because", "7"),
        ("The final answer is $5.00 dollars", "$5.00 dollars"),
        ("the answer is 3, no wait, the answer is 4", "4"),
        ("$\\frac{1}{2}$", "\\frac{1}{2}"),
        ("Paris", "Paris"),
    ],
)
def test_extract_final_answer(text, final):
    assert extract_final_answer(text) == final


@pytest.mark.parametrize(
    "candidate, gold",
    [
        ("1,234", "1234"),
        ("1,234,567.5", "1234567.5"),
        ("$42", "42"),
        ("\\$42", "42"),
        ("-$3", "-3"),
        ("42.0", "42"),
        ("42.", "42"),
        ("3/4", "0.75"),
        ("\\frac{3}{4}", ".75"),
        ("\\dfrac{6}{8}", "3/4"),
        ("-\\frac{1}{2}", "-0.5"),
        ("-5", "\u22125"),  # the minus sign
        ("\u0664\u0662", "42"),  # Arabic-Indic digits
        ("\uff14\uff12", "42"),  # fullwidth digits
        ("50%", "50"),
        ("50\\%", "50"),
        ("12 apples", "12"),
        ("3.5 km", "7/2"),
        ("Paris.", "Paris"),
        ("New  York", "New York"),
    ],
)
def test_answers_that_match(candidate, gold):
    assert answers_match(candidate, gold)
    assert answers_match(extract_final_answer(f"\\boxed{{{candidate}}}"), gold)


@pytest.mark.parametrize(
    "candidate, gold",
    [
        ("1,5", "15"),  # a comma only groups thousands
        ("0.33", "1/3"),  # exact, no tolerance
        ("0.5", "50%"),  # a percent sign is dropped, not divided
        ("41", "42"),
        ("4/0", "0"),
        ("5 or 6", "5"),
        ("10\u00b2", "102"),  # a superscript is not a digit
        ("1e3", "1000"),  # no exponents
        ("x", "42"),
        ("paris", "Paris"),  # non-numeric answers: case matters
        ("", "42"),
    ],
)
def test_answers_that_do_not_match(candidate, gold):
    assert not answers_match(candidate, gold)


def test_parse_number_values():
    assert parse_number("$1,234.50") == Fraction(2469, 2)
    assert parse_number("-0.75") == Fraction(-3, 4)
    assert parse_number("+7") == 7
    assert parse_number("") is None
    assert parse_number("9" * 200) is None  # longer than a number can be


@pytest.mark.parametrize(
    "text",
    [
        "1" * 1_000_000,
        "\\boxed{" * 150_000,
        "\\boxed{" + "{" * 1_000_000,
        "{" * 1_000_000 + "\\boxed{1}",
        "####" * 250_000,
        "the answer is " * 80_000,
        "the " * 250_000 + "answer",
        "the" + " " * 1_000_000 + "answer is 5",
        "1," * 500_000 + "000",
        "\\frac{" * 160_000 + "1}{2}",
        "\U0001f600" * 1_000_000,
    ],
)
def test_extraction_is_fast_on_hostile_megabyte_text(text):
    # CPU time of this process, not wall time: the bound catches super-linear work
    # (regex backtracking) at 25x or more over today's cost, whatever else runs.
    start = time.process_time()
    final = extract_final_answer(text)
    answers_match(final, "42")
    answers_match(text, "42")
    parse_number(text)
    assert time.process_time() - start < 1.0


def test_a_megabyte_answer_is_judged_quickly_when_allowed():
    env = DatasetQAEnv(max_answer_length=3_000_000)
    env.reset(seed=0)
    start = time.process_time()
    obs, reward, term, _, info = env.step(answer("1" * 1_000_000 + " \\boxed{" * 100_000))
    assert time.process_time() - start < 2.0
    assert reward == 0.0 and term and info["action_is_valid"]  # read as an answer: wrong
    assert env.observation_space.contains(obs) and len(obs) < 600


# ----- the generated set and loading ------------------------------------------------------
def test_generated_problems_are_deterministic_and_well_formed():
    records = generate_word_problems()
    assert records == generate_word_problems() and len(records) == GENERATED_SIZE
    assert len({r["question"] for r in records}) > 0.95 * GENERATED_SIZE
    for record in records:
        final = record["answer"].rsplit("#### ", 1)[1]
        assert final.isdigit(), record
    dataset = load_qa_dataset()
    assert dataset.answers[0] == records[0]["answer"].rsplit("#### ", 1)[1]
    assert dataset.charset <= set(map(chr, range(32, 127)))


def test_jsonl_round_trip_of_the_generated_set(tmp_path):
    path = write_jsonl(tmp_path / "gsm.jsonl", generate_word_problems())
    from_file = load_qa_dataset(path, answer_format="gsm8k")
    generated = load_qa_dataset()
    assert from_file.questions == generated.questions
    assert from_file.answers == generated.answers
    assert from_file is not generated


def test_jsonl_shapes_and_custom_fields(tmp_path):
    gsm = write_jsonl(tmp_path / "g.jsonl", [{"question": "1+1?", "answer": "1+1=2\n#### 2"}])
    meta = write_jsonl(
        tmp_path / "m.jsonl",
        [{"query": "Half of 9?", "response": "9/2 = 4.5\nThe answer is: 4.5", "type": "x"}],
    )
    custom = write_jsonl(
        tmp_path / "c.jsonl", [{"prompt": "Capital of France?", "target": "Paris", "q": 1}]
    )
    array = tmp_path / "MetaMathQA-395K.json"  # one JSON array, as MetaMathQA ships
    array.write_text(json.dumps([{"query": "2*3?", "response": "The answer is: 6"}] * 3))
    assert load_qa_dataset(str(array)).answers == ("6", "6", "6")
    assert load_qa_dataset(gsm).answers == ("2",)
    assert load_qa_dataset(meta).questions == ("Half of 9?",)
    assert load_qa_dataset(meta).answers == ("4.5",)
    env = DatasetQAEnv(path=custom, question_field="prompt", answer_field="target")
    obs, _ = env.reset(seed=0)
    assert obs == "Question: Capital of France?"
    assert env.step(answer("Paris"))[1] == 1.0
    env.reset(seed=0)
    assert env.step(answer("paris"))[1] == 0.0


def test_parquet_with_custom_fields_and_numeric_answers(tmp_path):
    path = str(tmp_path / "data.parquet")
    table = pa.table(
        {
            "problem_text": ["What is 6 x 7?", "What is 1/4 + 1/2?", "Price: 2 x $3 \u20ac?"],
            "final": [42, 0.75, 6],
            "other": ["a", "b", "c"],
        }
    )
    pq.write_table(table, path)
    env = gym.make(
        "ragen/MathWordProblems-v0", path=path, question_field="problem_text", answer_field="final"
    ).unwrapped
    assert env.dataset.answers == ("42", "0.75", "6")
    for index, reply in enumerate(["\\boxed{42}", "3/4", "The answer is $6."]):
        obs, _ = env.reset(seed=0, options={"index": index})
        assert env.observation_space.contains(obs)  # the euro sign is allowed
        _, reward, term, _, info = env.step(answer(reply))
        assert (reward, term, info["success"]) == (1.0, True, True)


# ----- errors name the keyword argument -------------------------------------------------
def test_bad_files_raise_errors_naming_the_kwarg(tmp_path):
    def fails(match, **kwargs):
        with pytest.raises(ValueError, match=match):
            gym.make("ragen/MathWordProblems-v0", **kwargs)

    fails(r"path='/no/such/file.jsonl': no such file", path="/no/such/file.jsonl")
    fails(r"path must be a path", path=42)
    (tmp_path / "empty.jsonl").write_text("\n\n")
    fails(r"path=.*holds no records", path=str(tmp_path / "empty.jsonl"))
    (tmp_path / "latin1.jsonl").write_bytes('{"question": "caf\u00e9"}\n'.encode("latin-1"))
    fails(r"path=.*not UTF-8", path=str(tmp_path / "latin1.jsonl"))
    (tmp_path / "broken.jsonl").write_text('{"question": "a", "answer": "1"}\n{oops\n')
    fails(r"path=.*line 2 is not valid JSON", path=str(tmp_path / "broken.jsonl"))
    (tmp_path / "list.jsonl").write_text("[1, 2]\n")
    fails(r"path=.*line 1 is a JSON list", path=str(tmp_path / "list.jsonl"))
    (tmp_path / "list.json").write_text("[1, 2]\n")
    fails(r"path=.*must hold an array of objects", path=str(tmp_path / "list.json"))
    (tmp_path / "cut.json").write_text('[{"question": "a", ')
    fails(r"path=.*not valid JSON", path=str(tmp_path / "cut.json"))
    (tmp_path / "data.csv").write_text("question,answer\n")
    fails(r"path=.*must end in one of", path=str(tmp_path / "data.csv"))
    (tmp_path / "fake.parquet").write_text("not parquet")
    fails(r"path=.*not a readable Parquet file", path=str(tmp_path / "fake.parquet"))

    good = write_jsonl(tmp_path / "ok.jsonl", [{"q": "1+1?", "a": "2"}, {"q": "2+2?"}])
    fails(r"question_field is not set and the file has none of", path=good)
    fails(
        r"question_field='prompt': the file has no such field", path=good, question_field="prompt"
    )
    fails(
        r"answer_field='a': record 2 .* has no such field",
        path=good,
        question_field="q",
        answer_field="a",
    )
    fails(r"answer_format must be one of", answer_format="latex")
    no_hashes = write_jsonl(tmp_path / "nh.jsonl", [{"question": "1+1?", "answer": "2"}])
    fails(
        r"answer_format='gsm8k': no final answer found in record 1",
        path=no_hashes,
        answer_format="gsm8k",
    )
    nulls = write_jsonl(tmp_path / "null.jsonl", [{"question": "1+1?", "answer": None}])
    fails(r"answer_field='answer': record 1 holds NoneType", path=nulls)
    pq.write_table(pa.table({"question": ["a"], "answer": ["1"]}), str(tmp_path / "t.parquet"))
    fails(
        r"answer_field='solution': the file has no such field",
        path=str(tmp_path / "t.parquet"),
        answer_field="solution",
    )
    fails(r"max_attempts must be an int", max_attempts=0)


# ----- cache, determinism, turns --------------------------------------------------------
def test_a_file_is_read_once_per_version(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "1+1?", "answer": "#### 2"}])
    first, second = DatasetQAEnv(path=path), DatasetQAEnv(path=path)
    assert first.dataset is second.dataset
    first.reset(seed=1)
    assert first.dataset is second.dataset
    assert DatasetQAEnv().dataset is DatasetQAEnv().dataset
    write_jsonl(tmp_path / "d.jsonl", [{"question": "2+2?", "answer": "#### 4"}])
    os.utime(path, ns=(1, 1))  # a different modification time, whatever the clock
    third = DatasetQAEnv(path=path)
    assert third.dataset is not first.dataset and third.dataset.answers == ("4",)


def test_seeded_draws_and_index_option():
    env = DatasetQAEnv()
    firsts = [env.reset(seed=seed)[0] for seed in range(30)]
    assert firsts == [DatasetQAEnv().reset(seed=seed)[0] for seed in range(30)]
    assert len(set(firsts)) > 25
    obs, _ = env.reset(seed=99, options={"index": 5})
    assert obs == "Question: " + env.dataset.questions[5] and env.index == 5
    with pytest.raises(ValueError, match=r"options\['index'\] must be an int"):
        env.reset(options={"index": GENERATED_SIZE})


def test_single_turn_by_default():
    env = gym.make("ragen/MathWordProblems-v0")
    env.reset(seed=4)
    obs, reward, term, trunc, info = env.step(answer("-1"))
    gold = env.unwrapped.gold
    assert (reward, term, trunc, info["success"], info["attempts"]) == (0.0, True, False, False, 1)
    assert obs.startswith(f"-1 is incorrect; the answer was {gold}.")
    env.reset(seed=4)
    obs, reward, term, _, info = env.step(answer(f"Adding up, the answer is {gold}."))
    assert (reward, term, info["success"], info["extracted_answer"]) == (1.0, True, True, gold)


def test_unreadable_answers_spend_no_attempt():
    env = DatasetQAEnv()
    env.reset(seed=0)
    obs, reward, term, trunc, info = env.step(answer("\\boxed{}"))
    assert reward == pytest.approx(-0.1) and not (term or trunc)
    assert not info["action_is_valid"] and info["format_ok"] and info["attempts"] == 0
    assert obs.startswith("No final answer found")
    _, reward, term, *_ = env.step("no tags at all")
    assert reward == pytest.approx(-0.1) and not term
    assert env.step(answer(env.gold))[1] == 1.0


def test_multi_turn_retries():
    env = DatasetQAEnv(max_attempts=3)
    assert "3 attempts" in env.instructions()
    obs, _ = env.reset(seed=2)
    question = obs
    gold = int(env.gold)
    obs, reward, term, trunc, info = env.step(answer(str(gold + 1)))
    assert obs == f"{gold + 1} is incorrect, try again (2 attempts left).\n{question}"
    assert (reward, term, trunc, info["actions_left"]) == (0.0, False, False, 2)
    obs, *_ = env.step(answer(str(gold + 2)))
    assert obs.startswith(f"{gold + 2} is incorrect, try again (1 attempt left).")
    obs, reward, term, _, info = env.step(answer(f"\\boxed{{{gold:,}}}"))
    assert (reward, term, info["success"], info["attempts"]) == (1.0, True, True, 3)
    env.reset(seed=2)
    for _ in range(3):
        obs, reward, term, trunc, info = env.step(answer("-7"))
    assert term and not info["success"] and f"the answer was {gold}" in obs
    with pytest.raises(RuntimeError):
        env.step(answer("1"))
