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
  it truncates with a Chernoff bound at tail mass 1e-15. :func:`pld_seconds` counts the one-step points
  (exact) and an estimate of the composed range, ``3 · (one-step range + ε_RDP(T, 1e-15))``, which covered
  the composed range (1.4-20x over) on every setting measured (``tests/accounting/test_accounting_range.py``). Its
  truncated mass (1e-15) makes ε = ∞ for δ near 1e-15: PLD is used only for δ ≥ ``PLD_MIN_DELTA``.

Costs: PRV in work units of about one PRV grid point each (~1 µs and ~80 bytes); past ``MAX_GRID_POINTS`` units
PRV is not called. PLD in seconds of dp_accounting's own time, from a cost model fitted to measurements on the
2-core reference machine (2026-12-03, dp-accounting 0.6.0, one ``PLDAccountant`` ε per case, the machine shared
with one other job): 33 cases, every PLD case of the project's accountant tests and of ``../shared/cases``
(A1-A10, F6-F8: 0.05-3.4 s), two cases an earlier limit refused (q 0.2, σ 0.5, T 3: 3.5 s add/remove, 4.8 s replace-one;
q 0.01, σ 0.35, T 120: 4.8 s, 6.1 s) and larger ones (q 0.05, σ 0.4, T 3000: 7.2 s; q 0.1, σ 0.3, T 1000:
12.9 s). Least squares on the relative error gave 6.6 µs per point of each one-step pmf (add/remove; one
privacy-loss evaluation each), 10.1 µs per point of the replace-one pmf, and 0.19 µs per point of the
composed-range estimate per pmf; measured/predicted lay in 0.73-1.38 on all 33. Past ``PLD_MAX_SECONDS`` = 15
predicted seconds (at most ~21 s measured at that spread; every case measured under 10 s predicts under 13.7 s)
PLD is not called: the plan uses RDP (add/remove) or refuses (replace-one). The rule is deterministic: σ never
depends on how fast the machine is. (The earlier limit, 2^22 work units with guessed weights, about
3-5 s here, refused those two cases.)

Events with a closed form take the exact route and have no grid cost: q = 1 (the Gaussian mechanism, sensitivity C
under add/remove and 2C under replace-one: the analytic Gaussian mechanism of Balle & Wang 2018) and a single step
(T = 1: the exact hockey-stick divergence of one subsampled Gaussian); see ``backends.exact_epsilon``. The grid
estimate above is for PLD's T-fold composition only, and the limit applies to nothing else.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dplora.accounting import registry
from dplora.accounting.backends import has_exact_route, prv_domain, rdp_epsilons
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent

# One PRV evaluation may cost at most this many work units: about 2-4 s on one core of the reference machine
# and under 0.5 GB (~80 bytes per grid point). PLD has its own measured limit, PLD_MAX_SECONDS.
MAX_GRID_POINTS = 2**22
# PLD's cost model, in seconds of dp_accounting's own time on the reference machine (measured: module docstring)
PLD_STEP_POINT_SECONDS = 6.6e-6  # a point of an add/remove one-step pmf: one privacy-loss evaluation
PLD_REPLACE_STEP_POINT_SECONDS = 1.01e-5  # a point of the replace-one one-step pmf
PLD_COMPOSED_POINT_SECONDS = 1.9e-7  # a point of the composed-range estimate, per pmf (FFT; the estimate runs high)
PLD_MAX_SECONDS = 15.0  # predicted; measured/predicted 0.73-1.38, so every case measured under 10 s is answered
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
        return f"{self.eps_error!r}/{self.pld_interval!r}/{MAX_GRID_POINTS}/{PLD_MAX_SECONDS!r}"


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


def pld_seconds(event: DpSgdEvent, interval: float) -> float:
    """Predicted seconds of one PLD evaluation of ``event`` on the reference machine (see the module docstring).

    Args:
        event: the T-step event (``event.steps`` the largest step count asked for).
        interval: the value discretisation interval, ε units.

    Returns:
        Seconds (∞ when one step's loss range is unbounded): one-step pmf points × their measured cost plus
        composed-range estimate points × theirs.
    """
    one_step = pld_step_range(event)
    if not math.isfinite(one_step):
        return math.inf
    tail = _rdp_eps(event, max(event.steps, 1), PLD_TAIL_MASS)
    replace = event.adjacency is Adjacency.REPLACE_ONE
    if replace:
        tail *= 2.0  # a replacement is a removal and an addition (group privacy of size 2)
    composed = min(event.steps * one_step, PLD_COMPOSED_FACTOR * (one_step + tail)) / interval
    pmfs = 1 if replace or event.sample_rate == 1.0 else 2
    step_cost = PLD_REPLACE_STEP_POINT_SECONDS if replace else PLD_STEP_POINT_SECONDS
    return pmfs * (step_cost * one_step / interval + PLD_COMPOSED_POINT_SECONDS * composed)


def out_of_range(accountant: Accountant | str, event: DpSgdEvent, delta: float, tolerance: Tolerance) -> str | None:
    """Why ``accountant`` must not be called on ``event`` at ``delta`` (None when it may be).

    ``event.steps`` must be the largest step count asked for: the cost grows with T. T = 0 is always in range;
    otherwise the accountant's object decides (:meth:`~dplora.accounting.registry.PrivacyAccountant.out_of_range`:
    :func:`prv_out_of_range`, :func:`pld_out_of_range`; RDP has no range).

    Raises:
        BadInputError: no accountant of that name is registered.
    """
    account = registry.make(accountant, event.adjacency)
    if event.steps == 0:
        return None
    return account.out_of_range(event, delta, tolerance)


def prv_out_of_range(event: DpSgdEvent, delta: float, tolerance: Tolerance) -> str | None:
    """Why Opacus's PRV must not be called on ``event`` (grid above ``MAX_GRID_POINTS``, δ below its floating
    point), None when it may be."""
    points = prv_grid_points(event, delta, tolerance.eps_error)
    if points > MAX_GRID_POINTS:
        return f"PRV would need {points:.3g} grid points (limit {MAX_GRID_POINTS:.3g}, see docs/sharp_edges.md)"
    if LONGDOUBLE_EPS * points > delta * 0.999:
        return f"δ={delta:g} is too small for PRV's floating point on {points:.3g} grid points"
    return None


def pld_out_of_range(event: DpSgdEvent, delta: float, tolerance: Tolerance) -> str | None:
    """Why dp_accounting's PLD must not be called on ``event`` (δ below ``PLD_MIN_DELTA``, predicted time above
    ``PLD_MAX_SECONDS``), None when it may be; a closed form (q = 1 or T = 1) is always in range."""
    if has_exact_route(event, event.steps):
        return None  # q = 1 or T = 1: dp_accounting's closed form, no grid (backends.exact_epsilon)
    if delta < PLD_MIN_DELTA:
        return f"δ={delta:g} is below PLD's range (δ ≥ {PLD_MIN_DELTA:g}; it truncates mass {PLD_TAIL_MASS:g})"
    seconds = pld_seconds(event, tolerance.pld_interval)
    if seconds > PLD_MAX_SECONDS:
        return (
            f"PLD would take about {seconds:.3g} s per evaluation (limit {PLD_MAX_SECONDS:g} s on the reference "
            "machine, see docs/sharp_edges.md)"
        )
    return None
