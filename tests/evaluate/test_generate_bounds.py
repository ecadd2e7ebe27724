"""`--max-new-tokens` is bounded (issue 26.4): 1 … 4096 for `dplora generate` and `dplora synth`, exit 2 above."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dplora.cli.app import app
from dplora.errors import BadInputError
from dplora.evaluate.generate import MAX_NEW_TOKENS, Sampling

runner = CliRunner()


def test_the_bound_is_4096_inclusive():
    assert MAX_NEW_TOKENS == 4096
    assert Sampling(max_new_tokens=4096).max_new_tokens == 4096
    with pytest.raises(BadInputError, match=r"--max-new-tokens=4097: must be in 1 … 4096"):
        Sampling(max_new_tokens=4097)


def test_generate_refuses_10_million_new_tokens_before_loading(tmp_path):
    """Exit 2 with one line naming the option, before the run folder is even read."""
    result = runner.invoke(
        app, ["generate", str(tmp_path / "no-run"), "--prompt", "hi", "--max-new-tokens", "10000000"]
    )
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "--max-new-tokens=10000000" in result.output and "4096" in result.output
