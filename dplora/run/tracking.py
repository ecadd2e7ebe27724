"""Experiment tracking (``training.report_to``): the plan's public numbers to TensorBoard, W&B, MLflow or trackio.

What may go to a tracker is a privacy question. The plan's numbers are public (they are in the signed record):
per step, ε spent after the step from the accountant's planned curve (:meth:`TrainingPlan.epsilon_at`); once, the
ε bound (the planned final ε and the target), δ, σ, q, C and T. Everything computed on the private data — the
training loss, the realised number of units and records per step, per-step wall time, tokens/s and a private
held-out evaluation — goes to a tracker only with ``training.report_private: true``, under the tag prefix
:data:`PRIVATE_PREFIX` (``not_covered_by_dp/``): it is NOT covered by the DP guarantee.

Where the files go (never inside the release folder, so ``dplora verify`` is unaffected):

* ``tensorboard``: public tags under ``<output_dir>.tracking/tensorboard/<run_id>/`` (as shareable as the record);
  private tags, when asked for, under ``<output_dir>.private/tensorboard/<run_id>/`` (written in
  ``<output_dir>.partial/private/`` while the run runs, published with the rest of the private folder). Written
  with ``torch.utils.tensorboard.SummaryWriter`` directly: two log folders, one per audience, which accelerate's
  ``TensorBoardTracker`` (one folder) does not give. Needs ``pip install tensorboard`` (extra ``dplora[track]``).
* ``wandb``, ``mlflow``, ``trackio``: one run through accelerate's tracker classes (``accelerate.tracking``), the
  private tags in the same run only when asked for. wandb's console capture is turned off
  (``wandb.Settings(console="off")``): the terminal bar shows the training loss. MLflow's local files go to
  ``<output_dir>.tracking/mlflow`` unless ``MLFLOW_TRACKING_URI`` says otherwise.
"""

from __future__ import annotations

import importlib.util
import math
import time
from pathlib import Path

from dplora.errors import BadInputError

PRIVATE_PREFIX = "not_covered_by_dp/"
PUBLIC_PREFIX = "dp/"
BACKENDS = ("none", "tensorboard", "wandb", "mlflow", "trackio")
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}


def tracking_path(out: Path) -> Path:
    """``<output_dir>.tracking``: the public tracker files, beside the release and never in it."""
    out = Path(out)
    return out.with_name(out.name + ".tracking")


def check_backend(backend: str) -> None:
    """Refuse, before anything is written, a tracker whose library is not installed.

    Args:
        backend: ``training.report_to`` (one of :data:`BACKENDS`).
    Raises:
        BadInputError: the library is missing (``install X``).
    """
    backend = getattr(backend, "value", backend)
    if backend == "none":
        return
    module = _MODULES[backend]
    if importlib.util.find_spec(module) is None:
        extra = " (or pip install 'dplora[track]')" if backend == "tensorboard" else ""
        raise BadInputError(f"training.report_to={backend}: install {module} first: pip install {module}{extra}")
    if backend != "tensorboard" and importlib.util.find_spec("accelerate") is None:
        raise BadInputError(f"training.report_to={backend}: install accelerate (its trackers are used)")


def public_constants(plan) -> dict[str, float]:
    """The run-level public numbers logged once at step 0: ε bound (planned final and target), δ, σ, q, C, T."""
    values = {
        "epsilon_planned": plan.epsilon,
        "epsilon_target": plan.target_epsilon,
        "delta": plan.delta,
        "sigma": plan.noise_multiplier,
        "q": plan.sample_rate,
        "max_grad_norm": plan.max_grad_norm,
        "T": float(plan.steps),
    }
    return {PUBLIC_PREFIX + k: float(v) for k, v in values.items() if math.isfinite(float(v))}


def private_values(entry: dict) -> dict[str, float]:
    """The private diagnostics of one ``metrics.jsonl`` step line, under :data:`PRIVATE_PREFIX` (not covered by DP)."""
    private = entry.get("not_covered_by_dp") or {}
    values = {
        "train_loss": private.get("train_loss"),
        "units": private.get("units"),
        "records": private.get("records"),
        "seconds_per_step": entry.get("seconds"),
    }
    return {PRIVATE_PREFIX + k: float(v) for k, v in values.items() if isinstance(v, (int, float))}


class Tracker:
    """One run's tracker: :meth:`log_step` per logical step with its ``metrics.jsonl`` line, then :meth:`close`.

    Args:
        backend: ``training.report_to``.
        plan: the run's :class:`dplora.plan.training.TrainingPlan` (the public numbers come from it only).
        out: the final release folder (public files go to :func:`tracking_path`).
        private_dir: the run's private staging folder (private TensorBoard files go there).
        run_id: the run's id (one log folder per run).
        report_private: also log the private diagnostics, prefixed :data:`PRIVATE_PREFIX`.
    Raises:
        BadInputError: the backend's library is missing (:func:`check_backend`).
    """

    def __init__(
        self,
        backend,
        *,
        plan,
        out: Path,
        private_dir: Path,
        run_id: str,
        report_private: bool,
        started: str | None = None,
    ):
        self.backend = getattr(backend, "value", backend)
        check_backend(self.backend)
        self.plan, self.report_private = plan, report_private
        self._public = self._private = self._remote = None
        # Public events carry a synthetic wall time (the record's start, taken before the data was read, + step
        # seconds), never a real one: the gaps between real stamps are each step's duration, which follows the
        # private realised batch, and the first real stamp would time the data read.
        self._wall0 = _epoch(started) if started else float(int(time.time()))
        self._held: list[tuple[dict, int]] = []  # remote backends: public numbers sent at close, see _write
        self._out, self._run_id = out, run_id
        if self.backend == "tensorboard":
            self._public = _PublicEventFile(tracking_path(out) / "tensorboard" / run_id, wall0=self._wall0)
            if report_private:
                from torch.utils.tensorboard import SummaryWriter

                self._private = SummaryWriter(log_dir=str(Path(private_dir) / "tensorboard" / run_id))
        elif self.backend != "none" and report_private:  # private numbers go live (asked for): the run starts now
            self._remote = _remote_tracker(self.backend, out=out, run_id=run_id)
        self._write(public_constants(plan), {}, step=0)

    def log_step(self, entry: dict) -> None:
        """Log step ``entry["step"]``: ε spent from the plan (public), and the private values only if asked."""
        step = int(entry["step"])
        eps = self.plan.epsilon_at(step)
        public = {PUBLIC_PREFIX + "epsilon_spent": float(eps)} if math.isfinite(eps) else {}
        self._write(public, private_values(entry) if self.report_private else {}, step=step)

    def _whole_public_series(self) -> None:
        """Replace what was logged publicly by the plan's whole series (the same numbers, all T steps)."""
        series = _public_series(self.plan)
        if self._public is not None:
            self._public.replace([(tag, float(v), step) for values, step in series for tag, v in values.items()])
        elif self.backend not in ("none", "tensorboard"):
            self._held = [(values, step) for values, step in series if values]

    def log_private(self, values: dict[str, float], step: int) -> None:
        """Private numbers (a private held-out evaluation), only with ``report_private``; prefixed."""
        if self.report_private:
            self._write({}, {PRIVATE_PREFIX + k: float(v) for k, v in values.items()}, step=step)

    def _write(self, public: dict, private: dict, *, step: int) -> None:
        if self._public is not None:
            for tag, value in public.items():
                self._public.add_scalar(tag, value, step)
            if self._private is not None:
                for tag, value in private.items():
                    self._private.add_scalar(tag, value, step)
        elif self.backend not in ("none", "tensorboard"):
            # A remote server stamps each call's arrival, so public numbers sent per step would time each step:
            # they are held and sent together at close (the run itself is opened then, unless private numbers
            # were asked for). Private ones (report_private, not covered by DP) go live.
            if public:
                self._held.append((public, step))
            if private and self._remote is not None:
                self._remote.log(private, step=step)

    def close(self, *, completed: bool = True) -> None:
        """Flush and close the writers (safe to call twice).

        The public numbers are the plan's (ε spent after each step of its curve, the run's constants), so the
        public series a tracker keeps is written whole, steps 1..T, from the plan, and only for a run that
        ``completed`` all T steps: a run stopped by a signal or a failure writes and sends no public number (how
        far it got follows wall-clock time and its private batches), and its resumed run's series is the same as
        an uninterrupted run's, whichever step the interruption reached.
        """
        if completed:
            self._whole_public_series()
        else:
            if self._public is not None:
                self._public.discard()  # nothing public for a run that did not finish
            self._held.clear()
        for writer in (self._public, self._private):
            if writer is not None:
                writer.close()
        if self._held and self._remote is None:
            self._remote = _remote_tracker(self.backend, out=self._out, run_id=self._run_id)
        if self._remote is not None:
            for public, step in self._held:
                self._remote.log(public, step=step)
            self._held.clear()
            self._remote.finish()
        self._public = self._private = self._remote = None


def _public_series(plan) -> list[tuple[dict, int]]:
    """The public numbers of a whole run: the constants at step 0, then ε spent after each step 1..T (finite)."""
    series = [(public_constants(plan), 0)]
    for step in range(1, int(plan.steps) + 1):
        eps = plan.epsilon_at(step)
        if math.isfinite(eps):
            series.append(({PUBLIC_PREFIX + "epsilon_spent": float(eps)}, step))
    return series


def _epoch(when: str) -> float:
    """Seconds since the epoch of an ISO 8601 time (the record's ``started_at``)."""
    import datetime as dt

    return dt.datetime.fromisoformat(when).timestamp()


class _PublicEventFile:
    """The public TensorBoard log of one run: scalars held in memory, written at :meth:`close` as one event file.

    ``SummaryWriter`` names its file ``events.out.tfevents.<real time>.<host>.<pid>.<n>`` and stamps its first
    event with the real time: the creation time, the host and the process, and (with the file's mtime) the real
    end. This file has a neutral name, ``events.out.tfevents.<wall0>.dplora.0.0``, every event the synthetic time
    ``wall0 + step`` and the file's mtime ``wall0``: all public (``wall0`` is the record's start). Written with
    tensorboard's own ``RecordWriter`` and ``Event`` protobuf, read back by TensorBoard's ``EventAccumulator``.
    """

    def __init__(self, folder: Path, *, wall0: float):
        self.folder, self.wall0 = Path(folder), float(wall0)
        self._scalars: list[tuple[str, float, int]] = []

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        """Hold one scalar at ``step`` (written at close)."""
        self._scalars.append((tag, float(value), int(step)))

    def replace(self, scalars: list[tuple[str, float, int]]) -> None:
        """Hold ``scalars`` (tag, value, step) instead of what was added (nothing once written or discarded)."""
        if self._scalars is not None:
            self._scalars = list(scalars)

    def discard(self) -> None:
        """Write nothing at :meth:`close`."""
        self._scalars = None

    def close(self) -> None:
        """Write the event file (once; later calls do nothing)."""
        if self._scalars is None:
            return
        import os

        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.summary.writer.record_writer import RecordWriter
        from torch.utils.tensorboard.summary import scalar

        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"events.out.tfevents.{int(self.wall0)}.dplora.0.0"
        with open(path, "wb") as handle:
            writer = RecordWriter(handle)
            writer.write(Event(wall_time=self.wall0, file_version="brain.Event:2").SerializeToString())
            for tag, value, step in self._scalars:
                event = Event(wall_time=self.wall0 + step, step=step, summary=scalar(tag, value))
                writer.write(event.SerializeToString())
            writer.flush()
        for target in (path, self.folder):
            os.utime(target, (self.wall0, self.wall0))
        self._scalars = None


def _remote_tracker(backend: str, *, out: Path, run_id: str):
    """accelerate's tracker for ``backend``, started, console capture off."""
    from accelerate import tracking

    name = Path(out).name
    if backend == "wandb":
        import wandb

        tracker = tracking.WandBTracker(name, name=run_id, settings=wandb.Settings(console="off"))
    elif backend == "mlflow":
        tracker = tracking.MLflowTracker(name, logging_dir=str(tracking_path(out) / "mlflow"), run_name=run_id)
    else:
        tracker = tracking.TrackioTracker(name, name=run_id)
    if hasattr(tracker, "start"):
        tracker.start()
    return tracker


class TrackedMetrics:
    """The per-step ``metrics.jsonl`` file, each step line also handed to a :class:`Tracker` (other lines are not)."""

    def __init__(self, metrics, tracker: Tracker):
        self._metrics, self._tracker = metrics, tracker

    def write(self, text: str) -> int:
        """Write ``text`` to the file; a step line (JSON with ``step``) also goes to the tracker."""
        import json

        n = self._metrics.write(text)
        for line in text.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("step"), int):
                self._tracker.log_step(entry)
        return n

    def flush(self) -> None:
        """Flush the file."""
        self._metrics.flush()


def tracker_for(spec, started: str | None = None):
    """The run's :class:`Tracker` (``training.report_to``), or None for ``none``.

    Args:
        spec: the run's :class:`dplora.run.loop.RunSpec` (its config, output paths and id).
        started: the record's start time (UTC), the tracker run's only time.
    """
    from dplora.run.outputs import private_staging

    config = spec.config
    if config.report_to.value == "none":
        return None
    return Tracker(
        config.report_to,
        plan=spec.plan,
        out=spec.out,
        private_dir=private_staging(spec.staging),
        run_id=spec.run_id,
        report_private=config.report_private,
        started=started,
    )


def eval_scalars(evaluation) -> dict[str, float]:
    """The held-out evaluation's top-level numbers (private: logged only with ``training.report_private``)."""
    flat = {}
    for key, value in evaluation.to_dict().items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"eval/{key}"] = float(value)
    return flat
