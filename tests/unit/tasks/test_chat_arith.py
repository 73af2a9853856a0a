r"""The chat arithmetic task set: fixed disjoint held-out split, and prompts that never carry the answer."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from services.common.errors import InvalidArgument
from services.tasks.chat_arith import all_rows, chat_messages, render_prompt, split_rows, write_tasksets

# SmolLM2-135M-Instruct's template shape (ChatML with a default system message), written here.
TEMPLATE = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"[UNK]": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    raw = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="<|im_end|>")
    tok.chat_template = TEMPLATE
    return tok


def test_rows_and_fixed_disjoint_split() -> None:
    rows = all_rows()
    assert len(rows) == 90 * 8
    assert rows[0] == {
        "question": "What is $10 + 2$? Give the final answer as a LaTeX \\boxed{} expression.",
        "answer": "12",
    }
    train, held = split_rows()
    assert (len(train), len(held)) == (520, 200)
    assert not {r["question"] for r in train} & {r["question"] for r in held}
    assert split_rows() == (train, held)  # the same split on every call and machine (seeded)
    with pytest.raises(InvalidArgument, match="heldout_size"):
        split_rows(heldout_size=720)


def test_written_files_read_back(tmp_path: pathlib.Path) -> None:
    paths = write_tasksets(tmp_path)
    held = [json.loads(line) for line in paths["heldout"].read_text().splitlines()]
    assert held == split_rows()[1]


def test_prompt_never_leaks_the_answer(tokenizer: PreTrainedTokenizerFast) -> None:
    for row in all_rows():
        prompt = render_prompt(tokenizer, row)
        assert prompt.endswith("<|im_start|>assistant\n")
        assert row["question"] in prompt
        numbers = re.findall(r"\d+", prompt)
        assert row["answer"] not in numbers, prompt
        assert "\\boxed{}" in prompt and not re.search(r"\\boxed\{\d", prompt)  # no example answer


def test_messages_need_a_question() -> None:
    assert chat_messages({"question": "q", "answer": "1"}) == [{"role": "user", "content": "q"}]
    with pytest.raises(InvalidArgument, match="'question'"):
        chat_messages({"prompt": "q"})


def test_the_first_wording_asks_the_same_problems(tmp_path: pathlib.Path) -> None:
    latex_train, latex_held = split_rows()
    first_train, first_held = split_rows(wording="first")
    assert [r["answer"] for r in first_held] == [r["answer"] for r in latex_held]
    assert first_train[0]["question"].endswith("Put your final answer in \\boxed{}.")
    assert "$" not in first_train[0]["question"] and len(first_train) == len(latex_train)
    paths = write_tasksets(tmp_path, "first")
    assert "Put your final answer" in paths["heldout"].read_text()
    with pytest.raises(InvalidArgument, match="wording"):
        all_rows("other")
