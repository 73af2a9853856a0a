"""rollout_args: sampling and ignored keys pass, anything else is an error naming it and the allowed keys."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.explorer.rollout_args import IGNORED_KEYS, SAMPLING_KEYS, check_rollout_args


def test_sampling_and_ignored_keys_pass() -> None:
    check_rollout_args(["temperature", "n", "seed", "max_completion_tokens"])
    assert not SAMPLING_KEYS & IGNORED_KEYS


def test_an_unknown_key_is_named_with_the_allowed_ones() -> None:
    with pytest.raises(
        InvalidArgument, match=r"unknown rollout args \['tempreature'\]; allowed: \['max_tokens'"
    ) as err:
        check_rollout_args(["tempreature", "top_p"])
    assert err.value.field == "rollout_args"
