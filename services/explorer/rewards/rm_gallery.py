"""`rm_gallery_reward`: a reward from the RM-Gallery package (https://github.com/modelscope/RM-Gallery).

Trinity-RFT's RMGalleryFn, under its arguments: `reward_name` picks a reward of RM-Gallery's
registry (e.g. `math_verify_reward`), the other reward_fn_args construct it. It is called the way
`math_rm_workflow` calls it, `reward(experience, messages, ground_truth=truth)`: the reply becomes
an RM-Gallery sample (the prompt's chat messages as input, the reply as the answer labelled with
`{"reference": truth}`, the experience's info as metadata), the reward model evaluates it, and the
parts come back as {dimension name: score} (or {"reward": score} when the reward has no
dimensions); the workflow sums them.

RM-Gallery is imported on first use. It is not a dependency of this project (it pins
transformers < 5 and openai < 2 among heavy others): without it, constructing the reward raises an
error saying `pip install rm-gallery`.
"""

from __future__ import annotations

import uuid
from typing import Any

from services.common.errors import InvalidArgument
from services.explorer.extras import import_extra

_INSTALL = "pip install rm-gallery"


def _rm_gallery(module: str) -> Any:
    return import_extra("rm_gallery", module, install=_INSTALL, needed_by="rm_gallery_reward")


class RMGalleryReward:
    """See the module docstring."""

    requires = (("rm_gallery", _INSTALL),)

    def __init__(self, reward_name: str, **kwargs: Any) -> None:
        """`reward_name`: a name in RM-Gallery's RewardRegistry; `kwargs`: that reward's own arguments."""
        registry = _rm_gallery("core.reward.registry").RewardRegistry
        try:
            reward_cls = registry.get(reward_name)
        except AssertionError:  # RM-Gallery asserts the name is registered
            reward_cls = None
        if reward_cls is None:
            raise InvalidArgument(
                f"RM-Gallery has no reward named {reward_name!r} (see rm_gallery's RewardRegistry.list())",
                field="reward_fn_args.reward_name",
            )
        self.reward_model = reward_cls(**kwargs)

    def __call__(self, experience: Any, messages: list[dict[str, Any]], **kwargs: Any) -> dict[str, float]:
        """{part: score} of one reply; `kwargs` (ground_truth=…) also reach the reward model's evaluate."""
        sample = self.build_sample(experience, messages, **kwargs)
        return self.extract_reward(self.reward_model.evaluate(sample, **kwargs))

    @staticmethod
    def build_sample(experience: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        """The RM-Gallery DataSample of one reply to `messages`."""
        schema = _rm_gallery("core.data.schema")
        message = _rm_gallery("core.model.message")
        answer = schema.Step(
            role="assistant",
            content=str(experience.response_text),
            label={"reference": kwargs.get("ground_truth", "")},
        )
        return schema.DataSample(
            unique_id=uuid.uuid4().hex,
            input=[
                message.ChatMessage(role=message.MessageRole(m["role"]), content=m.get("content", ""))
                for m in messages
            ],
            output=[schema.DataOutput(answer=answer)],
            metadata=dict(experience.info),
        )

    @staticmethod
    def extract_reward(sample: Any) -> dict[str, float]:
        """{dimension: score} of the evaluated sample's answer ({"reward": score} without dimensions)."""
        try:
            reward = sample.output[0].answer.reward
        except (AttributeError, IndexError, TypeError) as exc:
            raise InvalidArgument(
                f"the RM-Gallery reward returned a sample without a reward ({exc})",
                field="reward_fn_args.reward_name",
            ) from exc
        reward_schema = _rm_gallery("core.reward.schema")
        if not reward.details:
            return {"reward": float(reward.score)}
        parts: dict[str, float] = {}
        for detail in reward.details:
            if isinstance(detail, reward_schema.RewardDimensionWithRank):
                if detail.rank:  # the first ranked position, as Trinity
                    parts[detail.name] = float(detail[0].score)
            elif isinstance(detail, reward_schema.RewardDimensionWithScore):
                parts[detail.name] = float(detail.score)
        return parts
