"""ε of a :class:`DpSgdEvent` under each accountant. Libraries only: Opacus (RDP, PRV), dp_accounting (PLD).

Opacus's RDP analysis is pure numpy/scipy. Importing it as ``opacus.accountants.analysis.rdp`` would run
``opacus/__init__`` and import torch (about 5 s), so when Opacus is not loaded yet the same file is loaded on
its own: ``dplora budget`` with RDP stays under 2 s. Opacus's PRV analysis (``accountants/analysis/prv``) is
numpy/scipy too, but its ``domain.py`` imports ``RDPAccountant`` (and so torch) for a helper dplora does not call
(:func:`prv_domain` computes the domain): it is loaded the same way, as a private package whose ``rdp`` sibling is
a stub, so the default accountant (PRV) also plans without torch.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import sys
import warnings
from pathlib import Path

import numpy as np

from dplora.accounting import registry
from dplora.accounting.events import Accountant, Adjacency, DpSgdEvent
from dplora.errors import UnsupportedAccountingError

# Opacus RDPAccountant.DEFAULT_ALPHAS (orders up to 63); a test checks they stay equal.
RDP_ORDERS: tuple[float, ...] = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


class AccountingNumericalError(ArithmeticError):
    """An accountant failed numerically on this event (e.g. PRV on very short or very loose runs)."""


@functools.cache
def opacus_rdp():
    """Opacus's ``accountants.analysis.rdp`` module (``compute_rdp``, ``get_privacy_spent``; Mironov et al. 2019).

    The real one when ``opacus`` is already imported; otherwise its file loaded alone (as
    ``_dplora_opacus_rdp_analysis``), without ``opacus/__init__`` and its torch imports. Cached.

    Raises:
        ImportError: Opacus is not installed.
    """
    if "opacus" in sys.modules:
        from opacus.accountants.analysis import rdp

        return rdp
    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("opacus is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "accountants" / "analysis" / "rdp.py"
    mod_spec = importlib.util.spec_from_file_location("_dplora_opacus_rdp_analysis", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


@functools.cache
def _opacus_prv():
    """Opacus's ``accountants.analysis.prv`` package, loaded without ``opacus/__init__`` when Opacus is not loaded.

    The files are Opacus's own; only the package names differ (``_dplora_opacus_acc.*``), so the real ``opacus``
    import is untouched. ``RDPAccountant`` (used only by ``Domain``'s ``compute_safe_domain_size``) is a stub that
    raises: dplora computes the domain in :func:`prv_domain`.
    """
    if "opacus" in sys.modules:
        from opacus.accountants.analysis import prv

        return prv
    import types

    spec = importlib.util.find_spec("opacus")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("opacus is not installed")
    root = Path(list(spec.submodule_search_locations)[0]) / "accountants"
    name = "_dplora_opacus_acc"
    if name + ".analysis.prv" in sys.modules:
        return sys.modules[name + ".analysis.prv"]

    def package(full: str, path: Path) -> types.ModuleType:
        module = types.ModuleType(full)
        module.__path__ = [str(path)]
        module.__package__ = full
        sys.modules[full] = module
        return module

    package(name, root)
    stub = types.ModuleType(name + ".rdp")

    class RDPAccountant:  # noqa: D101 - stub: never called by dplora
        def __init__(self, *args, **kwargs):
            raise ImportError("RDPAccountant is not loaded here (dplora computes the PRV domain itself)")

    stub.RDPAccountant = RDPAccountant
    sys.modules[name + ".rdp"] = stub
    package(name + ".analysis", root / "analysis")
    sys.modules[name + ".analysis.rdp"] = opacus_rdp()
    prv_spec = importlib.util.spec_from_file_location(
        name + ".analysis.prv",
        root / "analysis" / "prv" / "__init__.py",
        submodule_search_locations=[str(root / "analysis" / "prv")],
    )
    module = importlib.util.module_from_spec(prv_spec)
    sys.modules[name + ".analysis.prv"] = module
    _load_compose(name + ".analysis.prv.compose", root / "analysis" / "prv" / "compose.py")
    prv_spec.loader.exec_module(module)
    return module


_SIGNAL_IMPORT = "from scipy.signal import convolve\n"


def _lazy_convolve(*args, **kwargs):
    """``scipy.signal.convolve``, imported on first use (importing ``scipy.signal`` takes 1-4 s here)."""
    from scipy.signal import convolve

    return convolve(*args, **kwargs)


def _load_compose(full: str, path: Path) -> None:
    """Load Opacus's ``prv/compose.py`` as ``full`` with its ``scipy.signal`` import deferred to first use.

    ``convolve`` only composes two different PRVs; dplora composes one PRV with itself (the FFT route). The file
    is Opacus's text with that one import line bound to :func:`_lazy_convolve`; if the line is not found (another
    Opacus), the file is left to load as written.
    """
    source = path.read_text()
    if source.count(_SIGNAL_IMPORT) != 1:
        return
    module = importlib.util.module_from_spec(importlib.util.spec_from_file_location(full, path))
    module.__package__ = full.rpartition(".")[0]
    sys.modules[full] = module
    code = compile(source.replace(_SIGNAL_IMPORT, "convolve = _dplora_lazy_convolve\n"), str(path), "exec")
    module.__dict__["_dplora_lazy_convolve"] = _lazy_convolve
    exec(code, module.__dict__)  # noqa: S102 - Opacus's own file, one import line deferred


def accountant_version(accountant: Accountant | str) -> str:
    """Library and version that computes ``accountant``, e.g. ``"opacus 1.6.0"`` (its registry object's).

    Raises:
        BadInputError: no accountant of that name is registered.
    """
    return registry.get(accountant).version()


def require_supported(accountant: Accountant | str, adjacency: Adjacency | str) -> None:
    """Raise UnsupportedAccountingError unless ``accountant`` accounts ``adjacency`` (replace-one: PLD only).

    Raises:
        BadInputError: no accountant of that name is registered.
        UnsupportedAccountingError: the relation is not one the accountant supports.
    """
    registry.make(accountant, adjacency).require_supported()


def add_remove_only(name: str, adjacency: Adjacency) -> str:
    """The refusal of an Opacus accountant (``name``) asked for another relation than add/remove."""
    return (
        f"accountant={name} supports only adjacency=add_remove (Opacus's accountants are "
        f"add/remove only); for adjacency={Adjacency(adjacency).value} use accountant: pld"
    )


def _require_add_remove(event: DpSgdEvent, name: str) -> None:
    if event.adjacency is not Adjacency.ADD_REMOVE:
        raise UnsupportedAccountingError(add_remove_only(name, event.adjacency))


@functools.lru_cache(maxsize=256)
def _rdp_one_step(sample_rate: float, noise_multiplier: float) -> tuple[float, ...]:
    """RDP of one step at each of ``RDP_ORDERS`` (Opacus ``compute_rdp``); T steps cost T times this."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow at tiny σ: the order's RDP is then ∞
        one = opacus_rdp().compute_rdp(
            q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=list(RDP_ORDERS)
        )
    return tuple(float(v) for v in one)


def rdp_epsilons(event: DpSgdEvent, delta: float, steps: list[int]) -> list[float]:
    """RDP ε after each step count in ``steps`` (Opacus analysis; Mironov et al. 2019, conversion of Balle et al.).

    RDP of T compositions is T times the RDP of one step, so a whole curve costs one RDP evaluation. The
    conversion is Opacus's ``get_privacy_spent`` (Balle et al. 2020, Thm. 21), vectorised over the step counts
    with the same floating-point operations, so each value equals Opacus's own.
    """
    _require_add_remove(event, "rdp")
    one = np.asarray(_rdp_one_step(event.sample_rate, event.noise_multiplier))
    orders = np.asarray(RDP_ORDERS)
    counts = np.asarray(steps, dtype=float)
    out = np.zeros(len(counts))
    with np.errstate(invalid="ignore", over="ignore"):
        for lo in range(0, len(counts), 4096):  # 4096 x 151 orders per block: about 5 MB
            block = counts[lo : lo + 4096]
            rdp = one[None, :] * block[:, None]
            eps = rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
            eps = np.where(np.isnan(eps), np.inf, eps)
            out[lo : lo + 4096] = eps.min(axis=1)
    out[counts == 0] = 0.0
    return [max(0.0, float(v)) for v in out]  # the conversion goes below 0 at large δ; ε = 0 is then the bound


def prv_domain(event: DpSgdEvent, delta: float, eps_error: float) -> tuple[float, float, float]:
    """(L, mesh, grid points) of the domain [-L, L] that Opacus's ``PRVAccountant`` discretises for ``event``.

    The arithmetic of ``opacus/accountants/prv.py`` (``_get_domain``) and ``compute_safe_domain_size``
    (Gopi et al. 2021, Remark 5.6), with δ_err = δ/1000 and the RDP values from :func:`rdp_epsilons` (the same
    orders and operations as Opacus's ``RDPAccountant``, computed once per (q, σ)). Points are ∞ when RDP is.
    """
    steps = max(event.steps, 1)
    delta_error = delta / 1000
    add_remove = DpSgdEvent(sample_rate=event.sample_rate, noise_multiplier=event.noise_multiplier, steps=steps)
    big_l = max(
        rdp_epsilons(add_remove, delta_error / 4, [steps])[0],
        rdp_epsilons(add_remove, delta_error / (8 * steps), [1])[0],
    )
    big_l = max(big_l, eps_error) + 3
    mesh = float(eps_error / np.sqrt(steps * np.log(12 / delta_error) / 2))
    if not math.isfinite(big_l):
        return big_l, mesh, math.inf
    t_min, t_max = np.floor(-big_l / mesh) * mesh, np.ceil(big_l / mesh) * mesh  # Domain.create_aligned
    size = int(np.round((t_max - t_min) / mesh)) + 1
    return big_l, mesh, float(size + size % 2)


def prv_epsilon(event: DpSgdEvent, delta: float, eps_error: float = 0.01) -> float:
    """PRV upper bound on ε (Opacus's PRV analysis, Gopi et al. 2021) computed to ``eps_error``.

    The steps of ``PRVAccountant.get_epsilon`` (δ_err = δ/1000), with the domain from :func:`prv_domain` so
    that Opacus's slow fractional-order RDP is not recomputed on every call; a test checks that the value
    equals ``PRVAccountant``'s.
    """
    _require_add_remove(event, "prv")
    prv = _opacus_prv()

    delta_error = delta / 1000
    big_l, mesh, _ = prv_domain(event, delta, eps_error)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            # log(1 - q) = log(0) at q = 1 and overflows at extreme σ do not change ε; they would break the
            # CLI's one-line stderr.
            warnings.filterwarnings("ignore", category=RuntimeWarning)
            # At large q (0.25-0.8, where the planner now goes) scipy's quad warns on the PRV's mean integral; the
            # value stays within eps_error of dp_accounting's PLD there (tests/plan/test_frontier.py), and the
            # checked curve floors it by RDP. A warning would break the CLI's one-line stderr.
            warnings.filterwarnings("ignore", message="The integral is probably divergent")
            domain = prv.Domain.create_aligned(-big_l, big_l, mesh)
            one = prv.PoissonSubsampledGaussianPRV(event.sample_rate, event.noise_multiplier)
            truncated = prv.TruncatedPrivacyRandomVariable(one, domain.t_min, domain.t_max)
            composed = prv.compose_heterogeneous([prv.discretize(truncated, domain)], [event.steps])
            _, _, eps = composed.compute_epsilon(delta, delta_error, eps_error)
            eps = float(eps)
    except (ValueError, RuntimeError, FloatingPointError, ZeroDivisionError, OverflowError, MemoryError) as err:
        raise AccountingNumericalError(f"PRV failed on this event: {err}") from err
    if not math.isfinite(eps):
        raise AccountingNumericalError("PRV returned a non-finite ε")
    return eps


def has_exact_route(event: DpSgdEvent, steps: int) -> bool:
    """Whether ``steps`` steps of ``event`` have an exact ε(δ) (:func:`exact_epsilon`): q = 1, or a single step."""
    return steps >= 0 and (event.sample_rate == 1.0 or steps <= 1)


def exact_epsilon(event: DpSgdEvent, delta: float, steps: int) -> float:
    """Exact ε(δ) of ``steps`` steps of ``event`` where a closed form exists (q = 1, or T = 1), via dp_accounting.

    - q = 1: T Gaussian mechanisms with noise std σC and L2 sensitivity C (add/remove) or 2C (replace-one) compose
      to one Gaussian mechanism with σ_eff = σ/(s·√T), s = 1 or 2; ε(δ) is the analytic Gaussian mechanism
      (Balle & Wang 2018, Thm. 8; ``dp_accounting.get_epsilon_gaussian``).
    - T = 1, q < 1: the hockey-stick divergence δ(ε) of one Poisson-subsampled Gaussian is exact in normal CDFs
      (``dp_accounting.pld.privacy_loss_mechanism.GaussianPrivacyLoss.get_delta_for_epsilon``, the pairs ADD and
      REMOVE under add/remove, REPLACE under replace-one, as PLD uses); ε is its root in ε (brentq), taken at
      the upper end so that δ(ε) ≤ δ.

    Args:
        event: q, σ and adjacency (its ``steps`` is ignored).
        delta: δ ∈ (0, 1).
        steps: T ≥ 0 (any T when q = 1, else T ≤ 1).

    Returns:
        ε ≥ 0 (unitless, natural log); 0 at T = 0, ∞ at σ = 0.

    Raises:
        ValueError: no closed form for this (q, T).
    """
    if not has_exact_route(event, steps):
        raise ValueError(f"no closed form for q={event.sample_rate}, T={steps}")
    if steps == 0:
        return 0.0
    if event.noise_multiplier == 0.0:
        return math.inf
    import dp_accounting

    if event.sample_rate == 1.0:
        scale = 2.0 if event.adjacency is Adjacency.REPLACE_ONE else 1.0
        eps = float(dp_accounting.get_epsilon_gaussian(event.noise_multiplier / (scale * math.sqrt(steps)), delta))
        return eps * (1.0 + 1e-9) + 1e-12  # round up: its root can sit a few ulps low (δ(ε) > δ by ~1e-14 relative)
    import scipy.optimize
    from dp_accounting.pld import privacy_loss_mechanism as plm

    kinds = (
        [plm.AdjacencyType.REPLACE]
        if event.adjacency is Adjacency.REPLACE_ONE
        else [plm.AdjacencyType.REMOVE, plm.AdjacencyType.ADD]
    )
    out = 0.0
    with np.errstate(all="ignore"):
        for kind in kinds:
            loss = plm.GaussianPrivacyLoss(event.noise_multiplier, sampling_prob=event.sample_rate, adjacency_type=kind)

            def excess(eps: float, loss=loss) -> float:
                return float(loss.get_delta_for_epsilon(eps)) - delta

            if excess(0.0) <= 0:
                continue
            hi = 1.0
            while excess(hi) > 0:
                hi *= 2.0
                if hi > 1e6:
                    return math.inf
            root = scipy.optimize.brentq(excess, hi / 2 if hi > 1 else 0.0, hi, xtol=1e-12, rtol=1e-12)
            while excess(root) > 0:  # the upper end: δ(ε) ≤ δ holds at the returned ε
                root = math.nextafter(root, math.inf) * (1 + 1e-12)
            out = max(out, root)
    return out


def pld_epsilons(event: DpSgdEvent, delta: float, steps: list[int], interval: float = 1e-4) -> list[float]:
    """PLD ε after each step count (dp_accounting, pessimistic, connect-the-dots; Doroshenko et al. 2022).

    One step's PLD is built once (``from_gaussian_mechanism``, as ``PLDAccountant`` does for this event) and
    self-composed for each count; ``interval`` is the value discretisation interval. Step counts with a closed
    form (q = 1, or T = 1: :func:`exact_epsilon`) take it instead: the exact value, which the discretised PLD
    bounds from above, at no grid cost.
    """
    if all(has_exact_route(event, t) for t in steps):
        return [exact_epsilon(event, delta, t) for t in steps]
    import dp_accounting
    from dp_accounting.pld import privacy_loss_distribution

    relation = {
        Adjacency.ADD_REMOVE: dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        Adjacency.REPLACE_ONE: dp_accounting.NeighboringRelation.REPLACE_ONE,
    }[event.adjacency]
    out = []
    try:
        with np.errstate(all="ignore"):
            one = privacy_loss_distribution.from_gaussian_mechanism(
                standard_deviation=event.noise_multiplier,
                value_discretization_interval=interval,
                sampling_prob=event.sample_rate,
                neighboring_relation=relation,
            )
            for t in steps:
                out.append(0.0 if t == 0 else float(one.self_compose(t).get_epsilon_for_delta(delta)))
    except (ValueError, ArithmeticError, MemoryError) as err:
        raise AccountingNumericalError(f"PLD failed on this event: {err}") from err
    if any(math.isnan(v) for v in out):
        raise AccountingNumericalError("PLD returned NaN")
    return out


def pld_epsilon(event: DpSgdEvent, delta: float, interval: float = 1e-4) -> float:
    """PLD ε after ``event.steps`` steps (see :func:`pld_epsilons`)."""
    return pld_epsilons(event, delta, [event.steps], interval)[0]


def epsilons(
    event: DpSgdEvent, delta: float, accountant: Accountant | str, steps: list[int], tolerance=None
) -> list[float]:
    """The accountant's own ε (≥ 0) after each step count in ``steps``, unchecked (see ``checked.py``).

    Args:
        event: q, σ and adjacency (its ``steps`` is ignored).
        delta: δ ∈ (0, 1).
        accountant: the registry name of the accountant that computes ε (:mod:`dplora.accounting.registry`).
        steps: step counts (integers ≥ 0).
        tolerance: a :class:`dplora.accounting.cost.Tolerance` (PRV eps_error, PLD interval); library defaults
            when None.

    Returns:
        ε per step count: 0 at T = 0 and ∞ at σ = 0 (T > 0) for every accountant, else the accountant's number
        floored at 0 (NaN stays NaN: a failed check).

    Raises:
        BadInputError: no accountant of that name is registered.
        UnsupportedAccountingError: the accountant does not support the event's relation (RDP or PRV asked for
            replace-one).
        AccountingNumericalError: the accountant failed numerically.
    """
    account = registry.make(accountant, event.adjacency)
    if event.noise_multiplier == 0.0:
        return [0.0 if t == 0 else math.inf for t in steps]
    account.require_supports(event)
    values = account.epsilons(event, delta, list(steps), tolerance)
    return [v if math.isnan(v) else max(0.0, v) for v in values]  # never negative; NaN stays NaN (a failed check)
