"""``specshim.console.first_line``: how an error from elsewhere is quoted in one line."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, model_validator

from specshim import console


class VllmConfig(BaseModel):
    """A config that refuses itself as vLLM 0.26.0's did on an H100 (Model Runner V2 and the
    native path's speculative method)."""

    max_model_len: int = 0

    @model_validator(mode="after")
    def refuse(self) -> VllmConfig:
        raise ValueError("Model Runner V2 does not yet support: speculative method 'x'")


def test_a_config_refusal_names_what_was_refused() -> None:
    with pytest.raises(ValueError) as refused:
        VllmConfig()
    assert console.first_line(refused.value) == (
        "1 validation error for VllmConfig: Value error, Model Runner V2 does not yet "
        "support: speculative method 'x'"
    )


def test_a_field_refusal_names_the_field() -> None:
    with pytest.raises(ValueError) as refused:
        VllmConfig(max_model_len="many")  # type: ignore[arg-type]
    assert console.first_line(refused.value) == (
        "1 validation error for VllmConfig: max_model_len Input should be a valid integer, "
        "unable to parse string as an integer"
    )


def test_other_errors_are_their_first_line_or_their_type() -> None:
    assert console.first_line(RuntimeError("no room\nmore")) == "no room"
    assert console.first_line(KeyError()) == "KeyError"
