"""Clipping guidance: per-unit gradient norms of the base model + LoRA init on a public sample, and a suggested C.

A clip bound C near the median per-example gradient norm works well (Andrew et al. 2021, "Differentially Private
Learning with Adaptive Clipping", NeurIPS, which tracks the median norm privately): a C far below the typical norm
clips almost every unit and biases the update towards the clipped direction; a C far above it adds noise σC that
the gradients never use. This module measures the norms the engine would clip, exactly as it clips them: the
contract's model and LoRA initialisation (:func:`dplora.engine.lora.setup_model`, the same seed), the engine's
per-sample path (:func:`dplora.mechanism.optimizer.make_private`: ``privacy.per_sample`` fast or Opacus), and one
logical step's
forward/backward over the sample (:func:`dplora.run.loop.forward_backward`), whose
:class:`dplora.mechanism.clipping.UnitClipAccumulator` returns each unit's norm before clipping (a unit's vector is the
sum,
or with ``unit_clipping: mean`` the mean, of its records' gradients). Nothing is stepped, noised or released.

LoRA B starts at zero (Hu et al. 2021), so at initialisation every gradient of A is exactly zero and the norms
come from the B gradients alone; after training starts both contribute, so treat the suggestion as a starting point.

The sample is public (:mod:`dplora.data.public`): the contract's private data is never read. Measuring private
data would need a DP quantile charged to the ledger; dplora does not do that.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from dplora.contract.choices import ProtectedUnit, UnitClipping
from dplora.contract.spec import Contract, PrivacySection

QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90)
DEFAULT_SAMPLE = 256
CITATION = 'Andrew et al. 2021, "Differentially Private Learning with Adaptive Clipping" (median-quantile clipping)'
B_ZERO_NOTE = (
    "LoRA B starts at zero, so at initialisation grad A = 0 and the norms come from grad B alone; "
    "norms change as training moves B"
)
TRADE_OFF = "a C well below the median clips most units and biases the update; well above it, σC adds unused noise"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClipGuide:
    """What :func:`clip_guide` measured.

    Attributes:
        norms: (U,) fp64, each unit's flat L2 gradient norm over all trainable LoRA tensors, before clipping.
        records_per_unit: (U,) records of each unit in the sample (after ``max_records_per_unit``).
        source: where the sample came from, in words (a file name or the demo generator; never text).
        protected_unit: the contract's unit.
        current_c: the contract's ``privacy.max_grad_norm``.
        unit_clipping: how a unit's records make its vector (sum or mean), as the engine does.
    """

    norms: np.ndarray
    records_per_unit: np.ndarray
    source: str
    protected_unit: ProtectedUnit
    current_c: float
    unit_clipping: UnitClipping = UnitClipping.SUM

    @property
    def quantiles(self) -> dict[str, float]:
        """``{"p10": …, "p25": …, "p50": …, "p75": …, "p90": …}``: ``numpy.quantile`` (linear interpolation)."""
        values = np.quantile(self.norms, QUANTILES)
        return {f"p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, values, strict=True)}

    @property
    def suggested_c(self) -> float:
        """The median norm (Andrew et al. 2021)."""
        return float(np.median(self.norms))

    @property
    def clipped_fraction(self) -> float:
        """Share of units whose norm exceeds the contract's C (the engine scales exactly these down)."""
        return float(np.mean(self.norms > self.current_c))

    def to_dict(self) -> dict:
        """JSON-ready summary (public numbers only: the sample is public)."""
        return {
            "sample": self.source,
            "protected_unit": self.protected_unit.value,
            "units": int(len(self.norms)),
            "records": int(self.records_per_unit.sum()),
            "norm": "flat L2 over all trainable LoRA tensors of each unit's "
            + ("gradient" if self.protected_unit is ProtectedUnit.ROW else f"{self.unit_clipping.value} of gradients")
            + ", at the LoRA initialisation, before clipping",
            "quantiles": self.quantiles,
            "min": float(self.norms.min()),
            "mean": float(self.norms.mean()),
            "max": float(self.norms.max()),
            "suggested_max_grad_norm": self.suggested_c,
            "suggestion": f"the median norm ({CITATION}); {TRADE_OFF}",
            "current_max_grad_norm": self.current_c,
            "clipped_fraction_at_current": self.clipped_fraction,
            "note": B_ZERO_NOTE,
        }


def _units(table, privacy: PrivacySection, seed: int, sample: int):
    """The unit index of the sample (as the engine groups and caps units), cut to the first ``sample`` units."""
    from dplora.data import units as data_mod

    index = data_mod.build_unit_index(table, privacy, seed=seed)
    if index.num_units > sample:
        index = dataclasses.replace(index, records_of_unit=index.records_of_unit[:sample])
    return index


def unit_norms(contract: Contract, table, *, sample: int = DEFAULT_SAMPLE, threads: int | None = None, log=print):
    """Each unit's gradient norm (before clipping) of the contract's model at its LoRA init, via the engine's path.

    Args:
        contract: the contract (model, LoRA, unit, clipping construction, per-sample path, physical batch).
        table: the public records (``datasets.Dataset`` with the contract's columns, unit key at unit level).
        sample: measure at most this many units (the first in file order).
        threads: CPU threads (default: the contract's or the free cores).

    Returns:
        (norms (U,) fp64, records per unit (U,) int).

    Raises:
        BadInputError: the model cannot be loaded, or bad LoRA targets.
        TrainingFailedError, UncoveredParameterError: the per-sample path refuses the model (as ``train`` would).
    """
    import torch

    from dplora.data import tokens as tokenizing
    from dplora.engine import gradcheck, runtime
    from dplora.engine.lora import setup_model
    from dplora.engine.model import resolve_precision, select_device
    from dplora.mechanism import optimizer as dpopt
    from dplora.plan.training import measurement_twin
    from dplora.recipe.config import RunOptions, compile_run
    from dplora.run.loop import RunSpec, RunState, forward_backward

    warnings.filterwarnings("ignore", message="Full backward hook is firing")  # as train: Opacus on a frozen base
    warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
    torch.set_num_threads(threads or contract.training.threads or runtime.free_threads())
    device = select_device()
    dtype, allow_tf32 = resolve_precision(contract.model, device)
    model, tokenizer = setup_model(contract.model, contract.lora, contract.training, device, dtype, allow_tf32, log)
    index = _units(table, contract.privacy, contract.training.seed, sample)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.SGD([p for _, p in named], lr=0.0)  # never stepped
    # Only C matters here: the accumulator reports each unit's norm before it clips to C; no noise is drawn.
    plan = measurement_twin(contract.privacy, index.num_units)
    config = compile_run(contract, plan, RunOptions(threads=threads))
    wrapped, dp_opt, accountant = dpopt.make_private(
        model,
        optimizer,
        plan=plan,
        unit_mean=contract.privacy.unit_clipping is UnitClipping.MEAN,
        per_sample=contract.privacy.per_sample.value,
    )
    gradcheck.probe_per_sample_gradients(wrapped, named, dp_opt)  # as train: norms of a wrong per-example path mislead
    spec = RunSpec(
        config=config,
        unit_index=index,
        examples=tokenizing.tokenize_records(
            table, tokenizer, contract.data, max_seq_len=contract.training.max_seq_len
        ),
        pad_id=tokenizer.pad_token_id,
        device=device,
        dtype=dtype,
        allow_tf32=allow_tf32,
        threads=torch.get_num_threads(),
        run_id="clip-guide",
        out=None,
        staging=None,
        mechanism=None,  # the σ = 0 twin makes no mechanism: make_private below is the per-unit clipping alone
    )
    state = RunState(model=wrapped, optimizer=dp_opt, accountant=accountant, named=named)
    forward_backward(spec, state, np.arange(index.num_units))  # one "logical step" over every sampled unit
    _, norms = dp_opt.accumulator.finish()
    sizes = np.array([len(r) for r in index.records_of_unit], dtype=np.int64)
    return norms.detach().to("cpu", torch.float64).numpy(), sizes


def clip_guide(contract: Contract, table, source: str, **kw) -> ClipGuide:
    """Measure :func:`unit_norms` on the public ``table`` and summarise them (see :class:`ClipGuide`)."""
    norms, sizes = unit_norms(contract, table, **kw)
    return ClipGuide(
        norms=norms,
        records_per_unit=sizes,
        source=source,
        protected_unit=contract.privacy.protected_unit,
        current_c=contract.privacy.max_grad_norm,
        unit_clipping=contract.privacy.unit_clipping,
    )


def report_lines(guide: ClipGuide) -> list[str]:
    """The guidance as lines for the operator."""
    d = guide.to_dict()
    unit = guide.protected_unit.value
    q = "  ".join(f"{k} {v:.4g}" for k, v in d["quantiles"].items())
    return [
        f"sample: {d['sample']}",
        f"{d['units']} {unit} units, {d['records']} records; {d['norm']}",
        f"norms: min {d['min']:.4g}  {q}  max {d['max']:.4g}  (mean {d['mean']:.4g})",
        f"suggested privacy.max_grad_norm: {d['suggested_max_grad_norm']:.4g} = the median ({CITATION})",
        f"  {TRADE_OFF}",
        f"at the contract's C = {guide.current_c:g}: {100 * d['clipped_fraction_at_current']:.1f} % of units "
        "would be clipped",
        f"note: {B_ZERO_NOTE}",
    ]
