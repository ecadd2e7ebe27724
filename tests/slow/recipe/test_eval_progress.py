"""The slow tier of tests/recipe/test_eval_progress.py, whose docstring describes the module."""

from __future__ import annotations

import json
import time

import pytest
from conftest import train_tiny

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


SLOW_EVAL_S = 1.5


def test_slow_eval_timings_are_private_and_the_loop_alone_is_s_per_step(
    tmp_path, monkeypatch, tiny_model_dir, tickets_csv, signing_key
):
    """A train with a held-out split, its evaluation made 1.5 s slower: off a terminal no `held-out eval` line and
    no time reach the log or `--json`; `<out>.private/report.json` has the loop's measured time over T as
    s/step and the evaluation's seconds apart (issue 40: realised timings are private diagnostics)."""
    import dplora.evaluate.heldout as heldout
    from dplora.run import checkpoint

    loop_seconds, started = [], []
    real_eval = heldout.evaluate_model

    def timed_steps(point, _step):  # the loop of steps alone: from right before run_steps to right after it
        if point == "loop-start":
            started.append(time.perf_counter())
        elif point == "loop-end":
            loop_seconds.append(time.perf_counter() - started[-1])

    def slow_eval(*args, **kwargs):
        time.sleep(SLOW_EVAL_S)
        return real_eval(*args, **kwargs)

    monkeypatch.setattr(heldout, "evaluate_model", slow_eval)
    with checkpoint.fault_hook(timed_steps):
        result, out = train_tiny(
            tmp_path, tiny_model_dir, tickets_csv, signing_key, "--progress", "--json", data={"eval_fraction": 0.25}
        )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert not {"seconds", "seconds_per_step", "eval_seconds", "empty_steps"} & set(doc)
    # the estimate line (public: the plan and a timed synthetic step, printed before step 1) is the only timing
    realised = "".join(ln for ln in result.stderr.splitlines(keepends=True) if not ln.startswith("estimate:"))
    assert "held-out eval" not in realised and "s/step" not in realised
    report = json.loads((out.with_name(out.name + ".private") / "report.json").read_text())
    steps = doc["steps_done"]
    assert len(loop_seconds) == 1
    assert report["seconds_per_step"] == pytest.approx(loop_seconds[0] / steps, abs=2e-3)
    assert report["eval_seconds"] >= SLOW_EVAL_S
    assert report["seconds_per_step"] * steps <= report["seconds"] - SLOW_EVAL_S
    log = (out.with_name(out.name + ".private") / "train.log").read_text()
    assert "s/step" in log and ", held-out eval " in log
