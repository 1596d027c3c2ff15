"""The search QA env (ragen/SearchQA-v0): the generated world, BM25 retrieval quality,
the oracle on two-hop questions, the command protocol and the search budget, safe
observations, the user's own corpus, and one corpus and index per process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.qa.qa_answers import normalize_text
from ragen_envs.qa.search_index import get_index, import_bm25s, load_corpus, load_questions
from ragen_envs.qa.search_qa import SearchQAEnv, oracle_command
from ragen_envs.qa.search_world import generate_world


def answer(body: str) -> str:
    return f"<think>t</think><answer>{body}</answer>"


def write_jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def world():
    corpus = load_corpus()
    return corpus, load_questions(None, corpus), get_index(corpus)


# ----- the generated world ---------------------------------------------------------------
def test_world_is_deterministic_and_each_hop_is_needed(world):
    corpus, questions, _ = world
    assert generate_world() == generate_world()
    assert 300 <= len(corpus.passages) <= 3000 and len(questions) == 1200
    assert len({p.id for p in corpus.passages}) == len(corpus.passages)
    assert len({p.title for p in corpus.passages}) == len(corpus.passages)
    by_hops, coincidences = {1: 0, 2: 0}, 0
    for q in questions:
        by_hops[len(q.hops)] += 1
        (gold,) = q.answers
        last = corpus[q.hops[-1]]
        assert gold in last.text, q  # the last passage of the chain states the answer
        if len(q.hops) == 2:
            first = corpus[q.hops[0]]
            assert corpus[q.hops[1]].title in first.text  # the first names the second
            # One search is not enough, but for a company founded in the city of its
            # headquarters, whose first passage names the answer by chance.
            coincidences += gold in first.text
    assert by_hops == {1: 600, 2: 600}
    assert coincidences < 0.02 * 600


def test_bm25_top3_holds_the_gold_passage_of_one_hop_questions(world):
    corpus, questions, index = world
    one_hop = [q for q in questions if len(q.hops) == 1]
    found = {1: [], 3: []}
    for q in one_hop:
        hits = [p.id for p, _ in index.search(q.question, 3)]
        found[3].append(q.hops[0] in hits)
        found[1].append(q.hops[0] in hits[:1])
    # Measured: 98.8% at top 1, 99.5% at top 3 (names share words, so not 100%).
    assert np.mean(found[3]) >= 0.97
    assert np.mean(found[1]) >= 0.95
    assert np.mean(found[3]) < 1.0 or np.mean(found[1]) < 1.0  # the shared names bite
    scores = [s for _, s in index.search(one_hop[0].question, 3)]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0


def play_oracle(env: SearchQAEnv, index: int) -> tuple[bool, int]:
    env.reset(seed=0, options={"index": index})
    for turn in range(1, 20):
        *_, term, trunc, info = env.step(answer(oracle_command(env)))
        if term or trunc:
            return info["success"], turn
    raise AssertionError("the episode did not end")


def test_oracle_solves_two_hop_questions_with_top3():
    env = SearchQAEnv(top_k=3, hops=2)
    results = [play_oracle(env, i) for i in range(len(env.questions))]
    success = np.mean([ok for ok, _ in results])
    assert success >= 0.95, success  # measured 97.3% (k=1: 92.3%, k=5: 99.8%)
    assert all(turns == 3 for ok, turns in results if ok)  # two searches and the answer
    one_hop = SearchQAEnv(top_k=3, hops=1)
    assert np.mean([play_oracle(one_hop, i)[0] for i in range(200)]) >= 0.97


# ----- the command protocol ---------------------------------------------------------------
def test_search_then_answer():
    env = gym.make("ragen/SearchQA-v0")
    inner: SearchQAEnv = env.unwrapped
    obs, info = env.reset(seed=3)
    assert obs.startswith("Question: ") and "Searches left: 4." in obs
    assert info == {"actions_left": 5, "success": False}
    first = inner.corpus[inner.question.hops[0]]
    obs, reward, term, trunc, info = env.step(answer(f"  SEARCH :  {first.title}  "))
    assert (reward, term, trunc) == (0.0, False, False)
    assert obs.startswith(f'Search 1 for "{first.title}": 3 passages.\n[1] ')
    assert f"{first.title} | {first.text}" in obs
    assert info["searches"] == 1 and info["searches_left"] == 3 and info["actions_left"] == 4
    assert first.id in info["retrieved"] and len(info["retrieved"]) == 3
    assert info["executed_actions"] == (f"search: {first.title}",)
    gold = inner.question.answers[0]
    obs, reward, term, trunc, info = env.step(answer(f"Answer: the {gold.upper()}!"))
    assert (reward, term, info["success"], info["searches"]) == (1.0, True, True, 1)
    assert info["retrieved"] == ()


def test_wrong_answer_ends_the_episode():
    env = SearchQAEnv()
    env.reset(seed=0)
    obs, reward, term, _, info = env.step(answer("answer: Atlantis"))
    assert (reward, term, info["success"]) == (0.0, True, False)
    assert obs.startswith(f"Atlantis is not the answer ({env.question.answers[0]}).")


@pytest.mark.parametrize(
    "body, why",
    [
        ("Ilsa Marrow", "Start with 'search:' or 'answer:'."),
        ("lookup: Ilsa Marrow", "Start with 'search:' or 'answer:'."),
        ("search:   ", "Nothing after 'search:'."),
        ("answer:", "Nothing after 'answer:'."),
    ],
)
def test_refused_commands_cost_the_penalty_and_nothing_else(body, why):
    env = SearchQAEnv()
    env.reset(seed=1)
    obs, reward, term, trunc, info = env.step(answer(body))
    assert obs.startswith(f"Refused: {why}\nQuestion: ")
    assert reward == pytest.approx(-0.1) and not (term or trunc)
    assert info["format_ok"] and not info["action_is_valid"] and info["num_invalid_actions"] == 1
    assert info["actions_left"] == 5 and info["searches"] == 0


def test_search_budget_runs_out():
    env = SearchQAEnv(max_searches=2)
    env.reset(seed=5)
    for n in (1, 2):
        _, reward, term, trunc, info = env.step(answer("search: capital"))
        assert (reward, term, trunc, info["searches"], info["searches_left"]) == (
            0.0,
            False,
            False,
            n,
            2 - n,
        )
    obs, reward, term, trunc, info = env.step(answer("search: capital"))
    assert obs.startswith("Refused: No searches left: answer with 'answer: ...'.")
    assert reward == pytest.approx(-0.1) and not (term or trunc)
    assert info["searches"] == 2 and info["actions_left"] == 1 and "Searches left: 0." in obs
    *_, term, trunc, info = env.step(answer(f"answer: {env.question.answers[0]}"))
    assert term and info["success"] and info["actions_left"] == 0
    # A budget of no searches: the first command must be the answer.
    zero = SearchQAEnv(max_searches=0)
    zero.reset(seed=0)
    assert zero.step(answer("search: x"))[4]["action_is_valid"] is False


def test_a_search_that_matches_nothing_still_counts():
    env = SearchQAEnv()
    env.reset(seed=0)
    obs, reward, _, _, info = env.step(answer("search: zzzq the of and"))
    assert obs.startswith('Search 1 for "zzzq the of and": no passage matches.\nQuestion:')
    assert reward == 0.0 and info["searches"] == 1 and info["retrieved"] == ()


def test_observations_stay_safe_and_bounded():
    env = SearchQAEnv(passage_max_chars=40, max_answer_length=5000)
    env.reset(seed=2)
    title = env.corpus.passages[0].title
    hostile = "search: " + "\u202e\x00<b>\U0001f600\n" * 200 + f"{title} " * 300
    obs, reward, *_ = env.step(answer(hostile))
    assert env.observation_space.contains(obs) and reward == 0.0
    echo = obs.split("\n", 1)[0]
    assert len(echo) < 100 and "\x00" not in echo and "\U0001f600" not in echo
    for line in obs.split("\n")[1:4]:
        assert line.startswith("[") and len(line.split(" | ", 1)[1]) <= 40
    assert len(obs) <= env.observation_space.max_length


def test_normalised_answers():
    assert normalize_text("  The Republic of  Velmora! ") == "republic of velmora"
    assert normalize_text("A.B.C.") == "b c"  # articles go after punctuation: 'a' is one
    assert normalize_text("Saint-\u00c9tienne") == "saint \u00e9tienne"


# ----- the user's corpus, and one index per process ----------------------------------------
@pytest.fixture
def user_files(tmp_path):
    corpus = write_jsonl(
        tmp_path / "corpus.jsonl",
        [
            {
                "id": "zurich",
                "title": "Z\u00fcrich",
                "text": "Z\u00fcrich is a city\n\tin Switzerland.",
            },
            {"id": "bern", "title": "Bern", "text": "Bern is the capital of Switzerland."},
            {"id": 7, "text": "Geneva lies on Lake Geneva."},
            {"title": "Basel", "text": "Basel is on the Rhine. " * 40},
        ],
    )
    questions = write_jsonl(
        tmp_path / "questions.jsonl",
        [
            {
                "question": "What is the capital of Switzerland?",
                "answer": ["Bern", "Berne"],
                "hops": ["bern"],
            },
            {"question": "Which lake is Geneva on?", "answer": "Lake Geneva"},
        ],
    )
    return corpus, questions


def test_user_corpus_and_questions(user_files):
    corpus_path, questions_path = user_files
    env = gym.make(
        "ragen/SearchQA-v0", corpus_path=corpus_path, questions_path=questions_path, top_k=2
    ).unwrapped
    assert [p.id for p in env.corpus.passages] == ["zurich", "bern", "7", "4"]
    assert env.corpus["zurich"].text == "Z\u00fcrich is a city in Switzerland."
    obs, _ = env.reset(seed=0, options={"index": 0})
    obs, *_, info = env.step(answer("search: Z\u00fcrich city"))
    assert env.observation_space.contains(obs) and "[1] Z\u00fcrich | Z\u00fcrich is a city" in obs
    assert 'Search 1 for "Z?rich city"' in obs  # the echo is sanitised, the passage is not
    assert info["retrieved"] == ("zurich",)  # Bern shares no word with the query
    assert env.step(answer("answer: berne"))[1] == 1.0  # any of the answers
    env.reset(options={"index": 0})
    assert oracle_command(env) == "search: Bern"
    env.step(answer(oracle_command(env)))
    assert oracle_command(env) == "answer: Bern"
    env.reset(options={"index": 1})
    assert oracle_command(env) == "answer: Lake Geneva"  # no hops: answered at once
    assert SearchQAEnv(
        corpus_path=corpus_path, questions_path=questions_path, hops=1
    ).questions == (env.questions[0],)


def test_user_file_errors_name_the_kwarg(tmp_path, user_files):
    corpus_path, questions_path = user_files

    def fails(match, **kwargs):
        with pytest.raises(ValueError, match=match):
            SearchQAEnv(**kwargs)

    fails(r"corpus_path='/nope.jsonl': no such file", corpus_path="/nope.jsonl")
    fails(r"questions_path='/nope.jsonl': no such file", questions_path="/nope.jsonl")
    bad = write_jsonl(tmp_path / "c1.jsonl", [{"title": "x"}])
    fails(
        r"corpus_path=.*record 1 needs a non-empty 'text'",
        corpus_path=bad,
        questions_path=questions_path,
    )
    dup = write_jsonl(tmp_path / "c2.jsonl", [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    fails(
        r"corpus_path=.*record 2 repeats the id 'a'", corpus_path=dup, questions_path=questions_path
    )
    (tmp_path / "c3.jsonl").write_bytes(b'{"text": "\xff\xfe"}\n')
    fails(r"corpus_path=.*not UTF-8", corpus_path=str(tmp_path / "c3.jsonl"))
    (tmp_path / "c4.jsonl").write_text("")
    fails(
        r"corpus_path=.*holds no records|corpus_path=.*no passages",
        corpus_path=str(tmp_path / "c4.jsonl"),
    )
    q1 = write_jsonl(tmp_path / "q1.jsonl", [{"question": "Why?"}])
    fails(
        r"questions_path=.*record 1 needs an 'answer'", corpus_path=corpus_path, questions_path=q1
    )
    q2 = write_jsonl(
        tmp_path / "q2.jsonl", [{"question": "Why?", "answer": "x", "hops": ["nowhere"]}]
    )
    fails(
        r"questions_path: question 1's hops name passages the corpus lacks",
        corpus_path=corpus_path,
        questions_path=q2,
    )
    fails(
        r"hops=2: no question has 2 hops",
        corpus_path=corpus_path,
        questions_path=questions_path,
        hops=2,
    )
    fails(r"top_k must be an int in \[1, 20\]", top_k=0)


def test_corpus_and_index_are_built_once_per_process(tmp_path, monkeypatch, user_files):
    builds = []
    bm25s = import_bm25s()
    original = bm25s.BM25.index

    def counting(self, *args, **kwargs):
        builds.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(bm25s.BM25, "index", counting)
    corpus_path, questions_path = user_files
    fresh = tmp_path / "fresh.jsonl"
    fresh.write_text(Path(corpus_path).read_text())
    first = SearchQAEnv(corpus_path=str(fresh), questions_path=questions_path)
    second = gym.make(
        "ragen/SearchQA-v0", corpus_path=str(fresh), questions_path=questions_path
    ).unwrapped
    assert len(builds) == 1
    assert first.index is second.index and first.corpus is second.corpus
    assert first.questions is second.questions
    for seed in range(5):
        first.reset(seed=seed)
        first.step(answer("search: Bern"))
        second.reset(seed=seed)
    assert len(builds) == 1
    # The generated world too: every env of the process shares its index.
    assert SearchQAEnv().index is SearchQAEnv(top_k=5).index is get_index(load_corpus())


@pytest.mark.vllm
def test_a_search_index_leaves_llvmlite_unloaded_for_vllm():
    """bm25s imports numba whenever it is installed (vLLM's CPU build installs it), and
    a process with llvmlite loaded cannot start a vLLM engine: the index imports bm25s
    with numba hidden. Run in a fresh process, in the vLLM test environment."""
    script = (
        "import sys\n"
        "from ragen_envs.qa.search_index import get_index, load_corpus\n"
        "get_index(load_corpus(None))\n"
        "print(sorted(m for m in ('numba', 'llvmlite', 'bm25s') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[-2] == "['bm25s']"
