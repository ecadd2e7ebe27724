"""``dplora plot RUN``: loss, ε and step time against the logical step, from the run's private ``metrics.jsonl``.

The figure is PRIVATE: the training loss and the step times are computed on the private data (the loss of the
sampled records, the time of the realised Poisson batch) and are not covered by ε. It is written only inside
``<output_dir>.private/`` (``training.png``), the private diagnostics' one home, which a release never includes; the
figure's title and the command's output say so. The style is ``dplora budget --plot``'s (6-inch-wide panels, 100
dpi, ε drawn as ``steps-pre`` from (0, 0) with the target as a red dashed line).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from dplora.errors import BadInputError
from dplora.run.outputs import METRICS_FILENAME, PRIVATE_SUBDIR, private_path, staging_path

PLOT_FILENAME = "training.png"
PRIVATE_TITLE = (
    "PRIVATE: NOT covered by DP (keep local, never ship)\nloss and step time are computed on the private data"
)


@dataclasses.dataclass(frozen=True)
class Series:
    """The per-step values read from ``metrics.jsonl`` (one entry per logical step, in file order).

    Attributes:
        steps: logical step numbers (1 … T).
        loss: mean training loss per record of the step (nats), None for an empty Poisson step (private).
        epsilon: ε spent after the step (the plan's checked curve), None for a non-private control (public).
        seconds: wall seconds of the step (private: it follows the realised batch).
    """

    steps: list[int]
    loss: list[float | None]
    epsilon: list[float | None]
    seconds: list[float]


@dataclasses.dataclass(frozen=True)
class PlotResult:
    """Where the figure went, what it plotted, and its title and axis labels (for the CLI and the tests)."""

    path: Path
    series: Series
    title: str
    labels: list[str]


def read_series(path: Path) -> Series:
    """The step entries of a ``metrics.jsonl`` (header and evaluation lines skipped).

    Raises:
        BadInputError: the file is missing or unreadable, a line is not JSON (named by number), or no step entry.
    """
    steps, loss, eps, secs = [], [], [], []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BadInputError(f"no metrics at {path}: dplora plot reads a trained run's private metrics.jsonl") from None
    except (OSError, UnicodeDecodeError) as err:
        raise BadInputError(f"cannot read {path}: {getattr(err, 'strerror', None) or err.__class__.__name__}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise BadInputError(f"{path}: line {number} is not JSON") from None
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int):
            continue  # the header note, held-out evaluations
        private = entry.get("not_covered_by_dp") or {}
        steps.append(entry["step"])
        loss.append(private.get("train_loss"))
        eps.append(entry.get("epsilon_upper"))
        secs.append(float(entry.get("seconds", 0.0)))
    if not steps:
        raise BadInputError(f"{path} has no training steps to plot")
    return Series(steps, loss, eps, secs)


def _target_epsilon(run: Path) -> float | None:
    """The run's ``privacy.target_epsilon`` from its ``contract.yaml``, or None (missing or unreadable)."""
    import yaml

    try:
        raw = yaml.safe_load((run / "contract.yaml").read_text(encoding="utf-8"))
        value = raw["privacy"]["target_epsilon"]
        return float(value) if isinstance(value, int | float) else None
    except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError):
        return None


def _private_metrics_folder(run: Path) -> tuple[Path, Path]:
    """(the folder that holds ``contract.yaml``, the private folder with ``metrics.jsonl``) for ``run``.

    A published run's private folder is ``<run>.private``. A run that was killed or failed left its steps in
    ``<run>.partial/private`` (no release): it is plotted from there, so that the steps it did can be looked at
    before ``train --resume``; ``run`` may name the output folder or the ``.partial`` folder itself.

    Raises:
        BadInputError: neither folder holds metrics (one line saying which folders were looked at).
    """
    if run.name.endswith(".partial"):
        run = run.with_name(run.name.removesuffix(".partial"))
    published, staged = private_path(run), staging_path(run) / PRIVATE_SUBDIR
    if (published / METRICS_FILENAME).is_file() or not (staged / METRICS_FILENAME).is_file():
        if not published.is_dir():
            raise BadInputError(
                f"no private folder {published} and no metrics in {staged}: dplora plot reads the private "
                "metrics.jsonl of a run that has done at least one step (a finished run, or a killed one's .partial)"
            )
        return run, published
    return staging_path(run), staged


def plot_run(run: Path) -> PlotResult:
    """Plot ``run``'s loss, ε and step time against the step into ``<run>.private/training.png``.

    Args:
        run: the run folder (``training.output_dir``); its metrics are ``<run>.private/metrics.jsonl``, or for a
            killed run without a release ``<run>.partial/private/metrics.jsonl``.

    Returns:
        A :class:`PlotResult` (the PNG's path, inside the private folder its metrics came from).

    Raises:
        BadInputError: matplotlib is not installed, no private folder or no metrics, or the PNG cannot be written.
    """
    try:
        import matplotlib
    except ImportError:
        raise BadInputError("dplora plot needs matplotlib: pip install matplotlib") from None
    run, folder = _private_metrics_folder(Path(run))
    series = read_series(folder / "metrics.jsonl")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    marker = "." if len(series.steps) < 50 else None
    fig, (ax_loss, ax_eps, ax_time) = plt.subplots(3, 1, figsize=(6, 10), sharex=True)
    loss = [float("nan") if v is None else v for v in series.loss]  # an empty step: a gap in the line
    ax_loss.plot(series.steps, loss, marker=marker, label="train loss (private)")
    ax_loss.set_ylabel("loss per record (nats)")
    eps = [(s, v) for s, v in zip(series.steps, series.epsilon, strict=True) if v is not None]
    if eps:
        ax_eps.plot((0, *[p[0] for p in eps]), (0.0, *[p[1] for p in eps]), drawstyle="steps-pre", marker=marker,
                    label="ε spent")  # fmt: skip
    target = _target_epsilon(run)
    if target is not None:
        ax_eps.axhline(target, color="red", linestyle="--", label="target ε")
    ax_eps.set_ylabel("ε")
    ax_time.plot(series.steps, series.seconds, marker=marker, label="step time (private)")
    ax_time.set_ylabel("seconds per step")
    ax_time.set_xlabel("logical steps T")
    for ax in (ax_loss, ax_eps, ax_time):
        ax.legend()
    fig.suptitle(PRIVATE_TITLE, fontsize=10, color="darkred")
    fig.tight_layout()
    path = folder / PLOT_FILENAME
    labels = [ax_loss.get_ylabel(), ax_eps.get_ylabel(), ax_time.get_ylabel(), ax_time.get_xlabel()]
    try:
        fig.savefig(path, dpi=100)
    except OSError as err:
        raise BadInputError(f"cannot write plot {path}: {err.strerror}") from None
    finally:
        plt.close(fig)
    return PlotResult(path=path, series=series, title=PRIVATE_TITLE, labels=labels)
