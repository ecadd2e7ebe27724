"""The working range of the numerical accountants, decided before they are called.

PRV (Opacus) and PLD (dp_accounting) discretise the privacy loss on a grid and compose it with FFTs. Their cost
is the grid size, and it can be known before the call from q, σ, T, δ and the tolerance:

- **PRV**: Opacus builds a domain [-L, L] with mesh ``eps_error / sqrt(T·ln(12/δ_err)/2)``, δ_err = δ/1000,
  where L = 3 + max(ε_RDP(T steps, δ_err/4), ε_RDP(1 step, δ_err/(8T)), eps_error) (Gopi et al. 2021,
  Remark 5.6; ``opacus/accountants/prv.py``). dplora computes that domain itself (:func:`prv_domain`, the same
  arithmetic and RDP orders) and hands it to Opacus's PRV analysis, so the estimate is the size allocated.
  Opacus also refuses when ``eps(longdouble) · size > δ - δ_err`` (floating point would dominate): checked here.
- **PLD**: dp_accounting builds one step's privacy-loss pmf over the loss range of the truncated Gaussian
  (``connect_dots_bounds``, exact and cheap), point by point, then self-composes it T times by FFT over a range
  it truncates with a Chernoff bound at tail mass 1e-15. :func:`pld_grid_points` counts the one-step points
  (exact) and an estimate of the composed range, ``3 · (one-step range + ε_RDP(T, 1e-15))``, which covered
  the composed range (1.4-20x over) on every setting measured (``tests/accounting/test_accounting_range.py``). Its
  truncated mass (1e-15) makes ε = ∞ for δ near 1e-15: PLD is used only for δ ≥ ``PLD_MIN_DELTA``.

Costs are in work units of about one PRV grid point each (~1 µs and ~80 bytes): measured on the 2-core reference
machine, a one-step PLD point costs about 10 (one privacy-loss evaluation each) and a composed PLD point about
0.5 of the estimate. Past ``MAX_GRID_POINTS`` units the accountant is not called: the plan uses RDP (add/remove)
or refuses (replace-one). The rule is deterministic: σ never depends on how fast the machine is.

Events with a closed form take the exact route and have no grid cost: q = 1 (the Gaussian mechanism, sensitivity C
under add/remove and 2C under replace-one: the analytic Gaussian mechanism of Balle & Wang 2018) and a single step
(T = 1: the exact hockey-stick divergence of one subsampled Gaussian); see ``backends.exact_epsilon``. The grid
estimate above is for PLD's T-fold composition only, and the limit applies to nothing else.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dplora.accounting.backends import has_exact_route, prv_domain, rdp_epsilons
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent

# One accountant evaluation may cost at most this many work units: about 2-4 s on one core of the reference
# machine (2-4 s idle/loaded) and under 0.5 GB (PRV: ~80 bytes per grid point).
MAX_GRID_POINTS = 2**22
PLD_STEP_POINT_WEIGHT = 10.0  # a one-step PLD point: one privacy-loss evaluation (~10 µs, measured)
PLD_COMPOSED_WEIGHT = 0.5  # a point of the composed-range estimate (FFT; the estimate runs 1.4-20x high)
PLD_TAIL_MASS = 1e-15  # dp_accounting's self_compose(tail_mass_truncation=1e-15), counted as infinite loss
PLD_MIN_DELTA = 100 * PLD_TAIL_MASS  # the truncated mass then moves δ by at most 1 %
PLD_COMPOSED_FACTOR = 3.0
LONGDOUBLE_EPS = float(np.finfo(np.longdouble).eps)

DEFAULT_EPS_ERROR = 0.01  # Opacus PRVAccountant.get_epsilon default
DEFAULT_PLD_INTERVAL = 1e-4  # dp_accounting PLDAccountant default value_discretization_interval


@dataclasses.dataclass(frozen=True, kw_only=True)
class Tolerance:
    """How precisely ε is computed: PRV's ``eps_error`` and PLD's discretisation interval (both in ε units).

    Both are the library default, or target/100 when that is finer, so a tiny target is computed to its own
    precision. ``slack`` is how far apart two upper bounds of the same accountant may lie before a decrease
    in T (or an increase in σ) counts as a failed check: 2·eps_error (PRV's upper bound is its estimate plus
    eps_error, the estimate itself within eps_error of the truth).
    """

    eps_error: float = DEFAULT_EPS_ERROR
    pld_interval: float = DEFAULT_PLD_INTERVAL

    @property
    def slack(self) -> float:
        return 2.0 * self.eps_error

    def key(self) -> str:
        """A stable string for cache keys."""
        return f"{self.eps_error!r}/{self.pld_interval!r}/{MAX_GRID_POINTS}"


def tolerance_for(target_epsilon: float | None) -> Tolerance:
    """The tolerance for a plan with this target: min(library default, target/100); defaults without target."""
    if target_epsilon is None:
        return Tolerance()
    return Tolerance(
        eps_error=min(DEFAULT_EPS_ERROR, target_epsilon / 100.0),
        pld_interval=min(DEFAULT_PLD_INTERVAL, target_epsilon / 100.0),
    )


def _rdp_eps(event: DpSgdEvent, steps: int, delta: float) -> float:
    add_remove = dataclasses.replace(event, adjacency=Adjacency.ADD_REMOVE)
    return rdp_epsilons(add_remove, delta, [steps])[0]


def prv_grid_points(event: DpSgdEvent, delta: float, eps_error: float) -> float:
    """Size of the domain Opacus's PRV analysis discretises for ``event`` (∞ when RDP is unbounded)."""
    return prv_domain(event, delta, eps_error)[2]


def pld_step_range(event: DpSgdEvent) -> float:
    """Width of one step's privacy-loss range in dp_accounting (max over the ADD/REMOVE or REPLACE pmfs)."""
    from dp_accounting.pld import privacy_loss_mechanism as plm

    kinds = (
        [plm.AdjacencyType.REPLACE]
        if event.adjacency is Adjacency.REPLACE_ONE
        else [plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD]
    )
    width = 0.0
    for kind in kinds:
        loss = plm.GaussianPrivacyLoss(event.noise_multiplier, sampling_prob=event.sample_rate, adjacency_type=kind)
        bounds = loss.connect_dots_bounds()
        width = max(width, float(bounds.epsilon_upper) - float(bounds.epsilon_lower))
    return width


def pld_grid_points(event: DpSgdEvent, interval: float) -> float:
    """Estimated work of one PLD evaluation of ``event``, in work units (see the module docstring)."""
    one_step = pld_step_range(event)
    if not math.isfinite(one_step):
        return math.inf
    tail = _rdp_eps(event, max(event.steps, 1), PLD_TAIL_MASS)
    if event.adjacency is Adjacency.REPLACE_ONE:
        tail *= 2.0  # a replacement is a removal and an addition (group privacy of size 2)
    composed = min(event.steps * one_step, PLD_COMPOSED_FACTOR * (one_step + tail)) / interval
    pmfs = 1 if event.adjacency is Adjacency.REPLACE_ONE or event.sample_rate == 1.0 else 2
    return pmfs * (PLD_STEP_POINT_WEIGHT * one_step / interval + PLD_COMPOSED_WEIGHT * composed)


def out_of_range(accountant: Accountant, event: DpSgdEvent, delta: float, tolerance: Tolerance) -> str | None:
    """Why ``accountant`` must not be called on ``event`` at ``delta`` (None when it may be).

    ``event.steps`` must be the largest step count asked for: the cost grows with T.
    """
    accountant = Accountant(accountant)
    if accountant is Accountant.RDP or event.steps == 0:
        return None
    if accountant is Accountant.PRV:
        points = prv_grid_points(event, delta, tolerance.eps_error)
        if points > MAX_GRID_POINTS:
            return f"PRV would need {points:.3g} grid points (limit {MAX_GRID_POINTS:.3g}, see docs/sharp_edges.md)"
        if LONGDOUBLE_EPS * points > delta * 0.999:
            return f"δ={delta:g} is too small for PRV's floating point on {points:.3g} grid points"
        return None
    if has_exact_route(event, event.steps):
        return None  # q = 1 or T = 1: dp_accounting's closed form, no grid (backends.exact_epsilon)
    if delta < PLD_MIN_DELTA:
        return f"δ={delta:g} is below PLD's range (δ ≥ {PLD_MIN_DELTA:g}; it truncates mass {PLD_TAIL_MASS:g})"
    points = pld_grid_points(event, tolerance.pld_interval)
    if points > MAX_GRID_POINTS:
        return f"PLD would cost {points:.3g} work units (limit {MAX_GRID_POINTS:.3g}, see docs/sharp_edges.md)"
    return None
