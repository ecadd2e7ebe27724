"""Learning-rate schedules over the T logical steps: constant, linear or cosine, each with linear warmup.

Data-independent (a function of the step count and public settings only), so they are post-processing of the
noised gradients and never touch the privacy event. The schedules are transformers' own
(``get_constant_schedule_with_warmup``, ``get_linear_schedule_with_warmup``, ``get_cosine_schedule_with_warmup``,
torch ``LambdaLR`` underneath); a resumed run fast-forwards the scheduler to the checkpoint's step.
"""

from __future__ import annotations

import warnings


def make_scheduler(optimizer, *, schedule: str, warmup_steps: int, total_steps: int):
    """A torch ``LambdaLR`` on ``optimizer`` (the torch optimiser, not the DP wrapper), stepped once per logical step.

    Args:
        optimizer: a ``torch.optim.Optimizer`` whose ``lr`` is the peak rate.
        schedule: ``constant``, ``linear`` (to 0 at T) or ``cosine`` (half a cosine to 0 at T).
        warmup_steps: logical steps of linear warmup from 0 (0: none).
        total_steps: T, the planned logical steps.

    Logical step s (0-based) trains at the schedule's rate for s + 1 over T + 1 steps: the library's warmup starts
    at 0 and its linear/cosine decay ends at 0, and a step at rate 0 would leave the LoRA tensors unchanged
    (the first-step sanity check refuses that); this way every one of the T steps has a rate > 0.

    Returns:
        ``torch.optim.lr_scheduler.LambdaLR``, already advanced once.

    Raises:
        ValueError: an unknown schedule.
    """
    from transformers import optimization as hf

    if schedule == "constant":
        scheduler = hf.get_constant_schedule_with_warmup(optimizer, warmup_steps)
    elif schedule == "linear":
        scheduler = hf.get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps + 1)
    elif schedule == "cosine":
        scheduler = hf.get_cosine_schedule_with_warmup(optimizer, warmup_steps, total_steps + 1)
    else:
        raise ValueError(f"lr_schedule={schedule!r}: expected constant, linear or cosine")
    step_scheduler(scheduler, 1)
    return scheduler


def step_scheduler(scheduler, steps: int = 1) -> None:
    """Advance ``scheduler`` by ``steps`` logical steps (resume: the checkpoint's step count)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "lr_scheduler.step() before optimizer.step()" on resume
        for _ in range(steps):
            scheduler.step()
