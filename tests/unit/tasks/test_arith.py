"""The synthetic arithmetic task: formats, determinism, difficulty knobs, the verifier."""

from __future__ import annotations

import json

import pytest

from services.common.errors import InvalidArgument
from services.tasks.arith import (
    ArithSpec,
    answer_reward,
    count_carries,
    digit_reward,
    generate,
    iter_problems,
    make_problem,
    write_jsonl,
)


def test_problem_format_is_zero_padded():
    spec = ArithSpec(digits=3)
    assert make_problem([47, 385], spec) == {"question": "047+385=", "answer": "0432"}
    assert make_problem([47, 385], ArithSpec(digits=3, reverse_answer=True))["answer"] == "2340"
    assert make_problem([900, 47], ArithSpec(digits=3, op="-")) == {"question": "900-047=", "answer": "853"}
    assert ArithSpec(digits=3, operands=3).answer_width == 4  # 3 * 999 = 2997
    assert ArithSpec(digits=3, max_value=99).answer_width == 3  # 99 + 99 = 198


def test_answers_are_correct():
    for row in generate(ArithSpec(digits=3, operands=3), 200, seed=1):
        values = [int(v) for v in row["question"].rstrip("=").split("+")]
        assert int(row["answer"]) == sum(values)


def test_generation_is_deterministic_and_distinct():
    spec = ArithSpec(digits=2)
    a, b = generate(spec, 100, seed=5), generate(spec, 100, seed=5)
    assert a == b
    assert a != generate(spec, 100, seed=6)
    assert len({r["question"] for r in a}) == 100


def test_exclude_keeps_sets_disjoint():
    spec = ArithSpec(digits=2)
    train = generate(spec, 500, seed=1)
    held = generate(spec, 500, seed=2, exclude={r["question"] for r in train})
    assert not {r["question"] for r in train} & {r["question"] for r in held}


def test_count_carries_by_hand():
    assert count_carries([47, 385], 3) == 2  # 7+5=12 carry, 4+8+1=13 carry, 0+3+1=4
    assert count_carries([111, 222], 3) == 0
    assert count_carries([999, 1], 3) == 3


def test_carry_limits_are_respected():
    easy = generate(ArithSpec(digits=3, max_carries=0), 100, seed=0)
    hard = generate(ArithSpec(digits=3, min_carries=2), 100, seed=0)
    parse = lambda r: [int(v) for v in r["question"].rstrip("=").split("+")]  # noqa: E731
    assert all(count_carries(parse(r), 3) == 0 for r in easy)
    assert all(count_carries(parse(r), 3) >= 2 for r in hard)


def test_max_value_caps_operands():
    rows = generate(ArithSpec(digits=3, max_value=99), 50, seed=0)
    assert all(r["question"].startswith("0") and r["question"][4] == "0" for r in rows)


def test_impossible_requests_and_bad_specs_are_rejected():
    with pytest.raises(InvalidArgument, match="distinct"):
        generate(ArithSpec(digits=1), 200, seed=0)  # only 100 one-digit pairs
    with pytest.raises(InvalidArgument, match="op"):
        ArithSpec(op="*")
    with pytest.raises(InvalidArgument, match="max_carries"):
        ArithSpec(min_carries=2, max_carries=1)


def test_iter_problems_is_endless_and_seeded():
    a, b = iter_problems(ArithSpec(), 3), iter_problems(ArithSpec(), 3)
    assert [next(a) for _ in range(5)] == [next(b) for _ in range(5)]


def test_write_jsonl(tmp_path):
    rows = generate(ArithSpec(), 3, seed=0)
    path = write_jsonl(rows, tmp_path / "sub" / "tasks.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


def test_rewards():
    assert answer_reward("0432<eos>", "0432") == 1.0
    assert answer_reward("0432<eos>99", "0432") == 1.0  # text after EOS is ignored
    assert answer_reward(" 0432 ", "0432") == 1.0
    assert answer_reward("04321<eos>", "0432") == 0.0
    assert answer_reward("", "0432") == 0.0
    assert digit_reward("0431<eos>", "0432") == 0.75
    assert digit_reward("043<eos>", "0432") == 0.0


def test_demo_tasksets_split_easy_labels_from_hard_problems(tmp_path):
    from services.tasks.arith import write_demo_tasksets

    paths = write_demo_tasksets(tmp_path, seed=1, n_sft=300, n_rl=200, n_eval=100)
    rows = {k: [json.loads(line) for line in p.read_text().splitlines()] for k, p in paths.items()}
    parse = lambda r: [int(v) for v in r["question"].rstrip("=").split("+")]  # noqa: E731
    assert [len(rows[k]) for k in ("sft", "rl", "eval")] == [300, 200, 100]
    assert all(count_carries(parse(r), 3) <= 1 for r in rows["sft"])
    assert all(count_carries(parse(r), 3) >= 2 for r in rows["rl"] + rows["eval"])
    assert not {r["question"] for r in rows["rl"]} & {r["question"] for r in rows["eval"]}
