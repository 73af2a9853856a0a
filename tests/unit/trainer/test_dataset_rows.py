"""Dataset rows the trainer tokenizes itself (services/trainer/dataset_rows.py): plaintext and
messages SFT rows, a row's tools in the chat template, every assistant turn of a conversation
(enable_concatenated_multi_turn), DPO preference pairs and cpt's plain text rows (with the loss
worked out by hand), on the builtin character tokenizer
(one token per character: expected tokens are read off the rendered text) with a small chat
template whose markers make the turns visible."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from services.common.config.algorithm import AlgorithmConfig
from services.common.config.buffer import FormatConfig
from services.common.config.schema import TrinityConfig
from services.common.errors import InvalidArgument
from services.common.experience import Experience
from services.models.loading import load_tokenizer
from services.trainer.algorithms.parts import POLICY_LOSS_FN
from services.trainer.batching import build_batch
from services.trainer.build import build_engine
from services.trainer.dataset_rows import text_row, tokenize_row
from services.trainer.dataset_source import DatasetAwareSource
from services.trainer.logprobs import response_logits, response_logprobs
from services.trainer.service import TrainerLoop
from tests.fakes.leasing_buffer import FakeBuffer
from tests.fakes.leasing_buffer import small_cfg as _cfg
from tests.fakes.trainer import BigramLogits

TEMPLATE = (
    "{% if tools %}[T:{{ tools[0].function.name }}]{% endif %}"
    "{% for m in messages %}<{{ m.role[0] }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)
CONVERSATION = [
    {"role": "user", "content": "1+1"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+2"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def tok():  # type: ignore[no-untyped-def]
    tokenizer = load_tokenizer("builtin:tiny-arith")
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def text(tok, ids) -> str:  # type: ignore[no-untyped-def]
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


def test_plaintext_row_is_prompt_then_response_and_eos(tok) -> None:  # type: ignore[no-untyped-def]
    fmt = FormatConfig(prompt_key="q", response_key="a", system_prompt="S")
    exp = tokenize_row({"q": "1+1=", "a": "2"}, fmt, tok, where="d[0]")
    assert text(tok, exp.tokens[: exp.prompt_length]) == "S\n1+1="
    assert exp.tokens[exp.prompt_length :].tolist() == [*tok.encode("2", add_special_tokens=False), 2]


def test_messages_row_trains_the_last_turn_with_the_rows_tools(tok) -> None:  # type: ignore[no-untyped-def]
    fmt = FormatConfig(prompt_type="messages")
    row = {"messages": CONVERSATION[:2], "tools": [{"type": "function", "function": {"name": "calc"}}]}
    exp = tokenize_row(row, fmt, tok, where="d[0]")
    assert text(tok, exp.tokens[: exp.prompt_length]) == "[T:calc]<u>1+1<a>"
    assert text(tok, exp.tokens[exp.prompt_length : -1]) == "2" and exp.tokens[-1] == 2
    assert exp.action_mask is None  # every response token is trained on
    without = tokenize_row({"messages": CONVERSATION[:2]}, fmt, tok, where="d[0]")
    assert text(tok, without.tokens[: without.prompt_length]) == "<u>1+1<a>"


def test_concatenated_multi_turn_trains_every_assistant_turn(tok) -> None:  # type: ignore[no-untyped-def]
    # "<u>1+1<a>2<u>2+2<a>4": the prompt is up to the first "<a>" (9 characters); the response
    # "2<u>2+2<a>4" is trained on its first and last character, the two assistant answers.
    fmt = FormatConfig(prompt_type="messages", enable_concatenated_multi_turn=True)
    exp = tokenize_row({"messages": CONVERSATION}, fmt, tok, where="d[0]")
    assert text(tok, exp.tokens) == "<u>1+1<a>2<u>2+2<a>4" and exp.prompt_length == 9
    assert exp.action_mask is not None
    assert exp.action_mask.tolist() == [True] + [False] * 9 + [True]
    exp.validate()
    last_only = tokenize_row({"messages": CONVERSATION}, FormatConfig(prompt_type="messages"), tok, where="d")
    assert text(tok, last_only.tokens[: last_only.prompt_length]) == "<u>1+1<a>2<u>2+2<a>"


def test_a_template_that_reorders_turns_cannot_train_every_turn() -> None:
    tokenizer = load_tokenizer("builtin:tiny-arith")
    tokenizer.chat_template = "{% for m in messages|reverse %}<{{ m.role[0] }}>{{ m.content }}{% endfor %}"
    fmt = FormatConfig(prompt_type="messages", enable_concatenated_multi_turn=True)
    with pytest.raises(InvalidArgument, match="does not render message 1 as a continuation") as info:
        tokenize_row({"messages": CONVERSATION}, fmt, tokenizer, where="sft[7]")
    assert info.value.field == "sft[7]"


def test_preference_pairs_plaintext_and_messages(tok) -> None:  # type: ignore[no-untyped-def]
    eos = [2]
    plain = tokenize_row({"prompt": "1+1=", "chosen": "2", "rejected": "3"}, FormatConfig(), tok, where="d")
    assert text(tok, plain.tokens) == "1+1=" and plain.prompt_length == 0
    assert plain.chosen is not None and plain.rejected is not None
    assert plain.chosen.tolist() == tok.encode("2", add_special_tokens=False) + eos
    assert plain.rejected.tolist() == tok.encode("3", add_special_tokens=False) + eos
    row = {
        "messages": CONVERSATION[:1],
        "chosen": [{"role": "assistant", "content": "2"}],
        "rejected": "11",
    }
    chat = tokenize_row(row, FormatConfig(prompt_type="messages"), tok, where="d")
    assert text(tok, chat.tokens) == "<u>1+1<a>"
    assert chat.chosen is not None and text(tok, chat.chosen[:-1]) == "2"
    assert chat.rejected is not None and text(tok, chat.rejected[:-1]) == "11"
    with pytest.raises(InvalidArgument, match="the 'rejected' response is empty"):
        tokenize_row({"prompt": "1+1=", "chosen": "2", "rejected": ""}, FormatConfig(), tok, where="d")


async def test_dpo_trains_on_pairs_read_from_a_file_dataset(tmp_path: pathlib.Path) -> None:
    from services.buffer.types import TaskBatch
    from services.common.experience import Task

    rows = [{"prompt": f"{a}+{a}=", "chosen": str(2 * a), "rejected": str(2 * a + 1)} for a in range(4)]

    class DatasetBuffer(FakeBuffer):
        cursor: int = 0

        async def read_tasks(self, taskset, batch_size, *, reader_id="", rewind=False):  # type: ignore[no-untyped-def]
            take = rows[self.cursor : self.cursor + batch_size]
            tasks = [
                Task(raw_task=r, task_id=f"p{self.cursor + i}", index=self.cursor + i)
                for i, r in enumerate(take)
            ]
            self.cursor += len(take)
            return TaskBatch(tasks, 0, self.cursor, end_of_data=self.cursor >= len(rows))

    base = _cfg(tmp_path).model_dump(include={"checkpoint_root_dir", "mode", "trainer", "monitor"})
    cfg = TrinityConfig.model_validate(
        {
            **base,
            "algorithm": {"algorithm_type": "dpo", "optimizer": {"lr": 1e-3}},
            "buffer": {
                "batch_size": 2,
                "train_batch_size": 2,  # 2 pairs a step (unset: batch_size x dpo's repeat_times 2)
                "trainer_input": {
                    "experience_buffer": {"name": "pairs", "storage_type": "file", "path": "unused.jsonl"}
                },
            },
        }
    )
    built = build_engine(cfg, device="cpu")
    loop = TrainerLoop(
        cfg,
        built.engine,
        built.tokenizer,
        DatasetAwareSource(DatasetBuffer(), built.tokenizer, cfg),
        state=built.state,
    )
    await loop.run()
    assert loop.engine.step == 2 and loop.cursor.samples == 4
    metrics = json.loads(pathlib.Path(loop.progress_path).read_text().splitlines()[0])["metrics"]
    assert np.isfinite(metrics["actor/dpo_loss"]) and metrics["actor/dpo_loss"] > 0


async def test_schema_type_names_a_row_of_the_other_kind(tmp_path: pathlib.Path) -> None:
    from services.common.experience import Task

    cfg = TrinityConfig.model_validate(
        {
            "checkpoint_root_dir": str(tmp_path),
            "buffer": {
                "trainer_input": {
                    "experience_buffer": {
                        "name": "pairs",
                        "storage_type": "file",
                        "path": "unused.jsonl",
                        "schema_type": "dpo",
                    }
                }
            },
        }
    )
    source = DatasetAwareSource(FakeBuffer(), load_tokenizer("builtin:tiny-arith"), cfg)
    storage = source.datasets["pairs"]
    pair = Task(raw_task={"prompt": "1=", "chosen": "1", "rejected": "2"}, task_id="p0", index=0)
    assert source._experience(pair, storage.format, "pairs", "dpo").chosen is not None
    sft = Task(raw_task={"prompt": "1=", "response": "1"}, task_id="p1", index=1)
    with pytest.raises(
        InvalidArgument, match="schema_type dpo: the row needs chosen/rejected columns"
    ) as info:
        source._experience(sft, storage.format, "pairs", "dpo")
    assert info.value.field == "pairs[1]"
    with pytest.raises(InvalidArgument, match="schema_type sft: the row needs a prompt and one response"):
        source._experience(pair, storage.format, "pairs", "sft")


def test_text_row_is_bos_then_the_whole_text_and_eos(tok) -> None:  # type: ignore[no-untyped-def]
    exp = text_row({"doc": "1+1=2", "text": "ignored"}, FormatConfig(text_key="doc"), tok, where="d[0]")
    bos, eos = tok.bos_token_id, tok.eos_token_id
    assert exp.tokens.tolist() == [bos, *tok.encode("1+1=2", add_special_tokens=False), eos]
    assert exp.prompt_length == 1 and exp.action_mask is None  # every text token and the EOS are trained on
    exp.validate()
    with pytest.raises(InvalidArgument, match="row has no text in 'text'.*set format.text_key") as info:
        text_row({"prompt": "1+1="}, FormatConfig(), tok, where="docs[3]")
    assert info.value.field == "docs[3]"


def test_text_row_without_a_bos_token_keeps_the_first_token_as_context() -> None:
    tokenizer = load_tokenizer("builtin:tiny-arith")
    tokenizer.bos_token = None
    exp = text_row({"text": "ab"}, FormatConfig(), tokenizer, where="d")
    assert exp.tokens.tolist() == [*tokenizer.encode("ab", add_special_tokens=False), tokenizer.eos_token_id]
    assert exp.prompt_length == 1  # "a" is the context of "b"; "b" and EOS are trained on


def test_cpt_loss_by_hand_every_token_against_sft_the_response_only(tok) -> None:  # type: ignore[no-untyped-def]
    # V = 100 tokens. The model: after "a", "a" has logit ln 99 and the other 99 tokens 0, so
    # p(a | a) = 99 / (99 + 99) = 1/2 and p(x | a) = 1 / 198 for x != a; after any other token
    # every token has p = 1/100.
    # cpt on "aab": [BOS] a a b [EOS], the four tokens after BOS trained:
    #   -log p: a|BOS ln 100, a|a ln 2, b|a ln 198, EOS|b ln 100
    #   token-mean = (4.605170 + 0.693147 + 5.288267 + 4.605170) / 4 = 3.797939
    # sft on prompt "aa", response "b": b|a ln 198, EOS|b ln 100 -> (5.288267 + 4.605170) / 2 = 4.946719
    assert len(tok) == 100
    a = tok.encode("a", add_special_tokens=False)[0]
    model = BigramLogits(len(tok)).prefer(after=a, token=a, logit=math.log(99))
    preset = AlgorithmConfig(algorithm_type="cpt")
    assert preset.part("policy_loss_fn") == "sft"
    loss_fn = POLICY_LOSS_FN.get(preset.part("policy_loss_fn"))

    def loss(exp: Experience) -> float:
        batch = build_batch([exp], pad_token_id=0)
        logits, start = response_logits(model, batch.inputs, logits_to_keep=False)
        logprob, _ = response_logprobs(
            logits,
            start,
            batch.inputs.responses,
            temperature=1.0,
            chunk_tokens=None,
            with_entropy=False,
            entropy_grad=False,
        )
        return float(loss_fn(batch.train, logprob)[0])

    cpt = text_row({"text": "aab"}, FormatConfig(), tok, where="d")
    assert loss(cpt) == pytest.approx((math.log(100) + math.log(2) + math.log(198) + math.log(100)) / 4)
    assert loss(cpt) == pytest.approx(3.797939, abs=1e-6)
    sft = tokenize_row({"prompt": "aa", "response": "b"}, FormatConfig(), tok, where="d")
    assert loss(sft) == pytest.approx(4.946719, abs=1e-6)
