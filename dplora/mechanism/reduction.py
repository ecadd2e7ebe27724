"""The cross-rank reduction of one logical step: clipped sums, the step's single noise draw and its counts.

One all-reduce per logical step (:class:`StepReducer`); every rank reads the same reduced buffer, so a failure or a
stop request on one rank is seen by every rank in the same step (:class:`FollowerSignals`). All ranks are one
trusted party (one operator's processes); what is protected is the release.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dplora.errors import DploraError, TrainingFailedError
from dplora.mechanism.noise import privatize
from dplora.signals import GracefulStop

if TYPE_CHECKING:
    from dplora.engine.distributed import World


class StepReducer:
    """One all-reduce per logical step: the clipped sums, rank 0's single noise draw, and the step's counts.

    The buffer is (P + 6,) fp32 on the parameters' device: [clipped sum (P,) | units, records, loss sum,
    noise draws, failed ranks, ranks asked to stop]. Rank 0 adds N(0, (σC)² I) to its part before the reduction;
    every rank reads the same reduced buffer, so every rank also learns in the same step that a rank failed or
    was asked to stop (SIGTERM/SIGINT: all ranks then stop after that step, rank 0 with a resume checkpoint).

    Args:
        world: the run's processes (W > 1).
        num_params: P, trainable LoRA parameters.
        device: where the buffer lives (CPU for gloo, the rank's GPU for nccl).
    """

    EXTRA = 6

    def __init__(self, world: World, num_params: int, device):
        import torch

        self.world, self.P = world, num_params
        self.buffer = torch.zeros(num_params + self.EXTRA, dtype=torch.float32, device=device)
        self.local = (0, 0, 0.0)  # units, records, loss sum of this rank's step
        self.failure: BaseException | None = None
        self.totals: dict[str, float] = {}
        self.noise_draws = 0  # over the run, all ranks (a resumed run starts from the checkpoint's steps)
        self.stop_requested = lambda: False  # this rank was asked to stop (a signal), read at each reduction

    def set_local(self, units: int, records: int, loss_sum: float) -> None:
        """This rank's counts for the step being reduced (units, records, loss sum in nats)."""
        self.local = (units, records, loss_sum)

    def fail(self, err: BaseException) -> None:
        """This rank's step failed: it still joins the reduction, which makes every rank raise."""
        self.failure = err

    def privatize(self, accumulator, *, noise_multiplier, max_grad_norm, expected_batch_size, generator):
        """Reduced (Σ_ranks clipped sums + one N(0, (σC)² I) draw) / E, shape (P,): the noisy mean gradient.

        Args:
            accumulator: this rank's :class:`dplora.mechanism.clipping.UnitClipAccumulator` for the step.
            noise_multiplier, max_grad_norm: σ and C; the noise std is σC.
            expected_batch_size: E, the public expected units per step over ALL ranks (never scaled by W).
            generator: rank 0's :class:`dplora.mechanism.noise.CsprngGaussian` (the only one that draws).

        Raises:
            TrainingFailedError: a rank failed this step (every rank raises; the failing rank re-raises its own
                error), or the noise was not drawn exactly once across ranks.
        """
        import torch
        import torch.distributed as dist

        part = self.buffer[: self.P]
        draws = 0
        if self.failure is None:
            try:
                clipped_sum, _ = accumulator.finish()
            except Exception as err:  # noqa: BLE001 - raised on every rank after the reduction
                self.failure = err
        if self.failure is not None:
            part.zero_()
        elif self.world.is_main:  # the one draw of the step, from rank 0's OS-entropy generator
            part.copy_(
                privatize(
                    clipped_sum,
                    noise_multiplier=noise_multiplier,
                    max_grad_norm=max_grad_norm,
                    expected_batch_size=1.0,
                    generator=generator,
                )
            )
            draws = 1
        else:
            part.copy_(clipped_sum)
        units, records, loss_sum = self.local
        extra = [units, records, loss_sum, draws, int(self.failure is not None), int(bool(self.stop_requested()))]
        self.buffer[self.P :].copy_(torch.tensor(extra, dtype=torch.float32))
        dist.all_reduce(self.buffer, op=dist.ReduceOp.SUM)
        values = self.buffer[self.P :].tolist()  # one host read of the step's totals
        names = ("units", "records", "loss_sum", "noise_draws", "failed_ranks", "stop")
        self.totals = dict(zip(names, values, strict=True))
        self.noise_draws += int(values[3])
        if values[4]:
            self._raise_failure()
        if values[3] != 1:
            raise TrainingFailedError(f"the noise was drawn {values[3]:g} times in one logical step, not once")
        return part / expected_batch_size

    def _raise_failure(self) -> None:
        """Every rank raises: the failing rank its own error, the others one naming the first failing rank."""
        import torch.distributed as dist

        mine = self.failure
        described = None if mine is None else (str(mine) if isinstance(mine, DploraError) else type(mine).__name__)
        messages: list[str | None] = [None] * self.world.world_size
        dist.all_gather_object(messages, described)
        self.failure = None
        if mine is not None:
            raise mine
        rank, message = next((r, m) for r, m in enumerate(messages) if m is not None)
        raise TrainingFailedError(f"rank {rank} failed: {message}")


def step_reducer(world: World, num_params: int, device) -> StepReducer | None:
    """The run's cross-rank reduction: a :class:`StepReducer` under W > 1 processes, None in one process (the
    optimizer then adds its own single noise draw).

    Args:
        world: the run's processes.
        num_params: P, trainable LoRA parameters (the reduced buffer holds P + 6 floats).
        device: the trainable tensors' device (CPU for gloo, the rank's GPU for nccl).
    """
    return StepReducer(world, num_params, device) if world.distributed else None


class FollowerSignals(GracefulStop):
    """On a rank other than 0: SIGTERM/SIGINT ask every rank to stop after the current step (through the step's
    reduction, where rank 0 writes a resume checkpoint); a second signal stops at once.

    Use as a context manager around the steps; :meth:`after_step` is ``run_steps``'s hook.
    """

    def __init__(self, reducer: StepReducer):
        super().__init__()
        self.reducer = reducer
        reducer.stop_requested = lambda: self.signal_name is not None

    @property
    def name(self) -> str | None:
        """The first signal's name (``SIGTERM``/``SIGINT``), or None."""
        return self.signal_name

    def on_again(self, name: str) -> None:
        rank = self.reducer.world.rank
        raise KeyboardInterrupt(f"interrupted ({name}) on rank {rank} during a step; no release was written")

    def after_step(self, spec, state) -> None:
        """Stop after this step when any rank was asked to (every rank saw the same reduced flag)."""
        if self.reducer.totals.get("stop"):
            raise KeyboardInterrupt(
                f"interrupted ({self.name or 'a signal on another rank'}) on rank {self.reducer.world.rank}: every "
                f"rank stopped after step {state.step}; no release was written; rank 0 reports the resume checkpoint"
            )


def common_forward_count(world: World, forwards: int, device) -> int:
    """The most physical batches any rank runs in this logical step (one all-reduce MAX of one integer).

    Under ``training.sharding: fsdp`` every forward and backward is collective (each layer all-gathers its base
    weights), so every rank must run the same number: a rank with fewer pads with forwards whose per-example rows
    are discarded (:func:`dplora.run.loop.forward_backward`). Poisson sampling is untouched: no unit is dropped,
    truncated or resampled. The count never leaves the process group (all ranks are one trusted party).

    Args:
        world: the run's processes; one process returns ``forwards``.
        forwards: this rank's physical batches in the step (≥ 0).
        device: the collective's device (CPU for gloo, the rank's GPU for nccl).
    """
    if not world.distributed:
        return forwards
    import torch
    import torch.distributed as dist

    count = torch.tensor([forwards], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())
