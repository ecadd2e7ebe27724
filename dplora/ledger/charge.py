"""One training run's ledger charge as one object (:class:`RunCharge`): open (room under the population's cap) →
reserve → settle | fail | record the release. The training recipe calls the ledger through it only, so the charge's
life reads in one place: every DP run is charged before its first noisy step and settled at ε of the steps it took
(the plan's curve at integer T), or at its reservation while a resume checkpoint keeps it resumable.
"""

from __future__ import annotations

from pathlib import Path

from dplora.errors import BadInputError, PlanRefusedError
from dplora.ledger.plans import check_plans
from dplora.ledger.store import Ledger, default_ledger_path
from dplora.plan.training import ledger_event
from dplora.run.checkpoint import CheckpointInfo
from dplora.run.config import RunConfig


class RunCharge:
    """One run's ledger charge, from the room check to the release: open → reserve → settle | fail | record release.

    Every DP run is charged: under ``privacy.population``, or as an unassigned run (found by its output folder)
    without one, whose ledger is opened (and created if missing) only at :meth:`reserve`, after setup, so that bad
    input found during setup writes nothing. A non-private control is charged ε = ∞ on a population (with
    ``--non-private``) and not at all without one. A resumed run keeps its original reservation.
    """

    def __init__(
        self,
        privacy,
        config: RunConfig,
        *,
        output_dir: str,
        ledger_path: Path | None = None,
        overwrite: bool = False,
        non_private: bool = False,
        tuning_trial: bool = False,
        ledger_release: bool = True,
    ):
        """Args: the contract's privacy section (what the charge states), the compiled run (plan, ``private``,
        population), the output folder (an unassigned run's key), and the caller's ledger options."""
        self.privacy, self.output_dir, self.plan = privacy, output_dir, config.plan
        self.private, self.population = config.private, config.population
        self.ledger_path, self.overwrite, self.non_private = ledger_path, overwrite, non_private
        self.tuning_trial, self.ledger_release = tuning_trial, ledger_release
        self.ledger: Ledger | None = None
        self._discard_ledger: Ledger | None = None  # a control's: only to settle a discarded run's charge
        self.run_id: str | None = None

    def _path(self) -> Path:
        return Path(self.ledger_path or default_ledger_path())

    def open(self, resumed_run: str | None) -> Ledger | None:
        """The ledger with room for the plan; a resumed run instead needs its own charge still pending.

        Raises:
            PlanRefusedError: no room under the population's cap, or a control on a population without
                ``--non-private``.
            BadInputError, LedgerError: a missing ledger (fails closed), or a resumed run without its charge.
        """
        self.run_id = resumed_run
        if not self.population:
            if not self.private:  # not charged; but --overwrite may discard an earlier DP run's folder here
                path = self._path()
                if self.overwrite and resumed_run is None and path.is_file():
                    self._discard_ledger = Ledger(path, create=False)
                return None
            if resumed_run is None:  # --overwrite may discard an unassigned run's checkpoint: settle its charge then
                path = self._path()
                self.ledger = Ledger(path, create=False) if self.overwrite and path.is_file() else None
                return self.ledger
            self.ledger = Ledger(self._path(), create=False)
            self._check_resumable(resumed_run)
            return self.ledger
        if not self.private and not self.non_private:
            pop = self.population
            raise PlanRefusedError(
                f"privacy.enabled=false on population {pop!r}: a non-private run is charged ε=∞ in the ledger, over "
                f"any cap, and every later DP run on {pop!r} is then refused; pass --non-private to run it anyway"
            )
        self.ledger = Ledger(self._path(), create=False)  # a missing ledger fails closed
        if resumed_run is None and self.private:
            check_plans(self.ledger, self.privacy, [self.plan])
        elif resumed_run is not None:
            self._check_resumable(resumed_run)
        return self.ledger

    def _check_resumable(self, resumed_run: str) -> None:
        """A resumed run needs its own charge, still pending, in this ledger. Raises: BadInputError."""
        try:
            status = self.ledger.charge(resumed_run).status
        except BadInputError:
            raise BadInputError(
                f"--resume: run {resumed_run} has no charge in ledger {self.ledger.path}: pass the ledger it was "
                "charged in"
            ) from None
        if status != "pending":
            raise BadInputError(
                f"--resume: run {resumed_run} is already {status} in ledger {self.ledger.path}: start anew"
            )

    def reserve(self, run_id: str, *, resumed: bool, checkpoint_dir: Path) -> None:
        """Reserve the run's charge (a resumed run keeps its original one), then tell the ledger where the run's
        resume checkpoint lives.

        Raises:
            PlanRefusedError: another run took the room first (the cap is checked again inside the transaction).
            LedgerError: the ledger cannot be created or opened (exit 2).
        """
        self.run_id = run_id
        if not resumed:
            self._reserve(run_id)
        if self.ledger is not None:
            self.ledger.set_checkpoint_path(run_id, str(checkpoint_dir.resolve()))

    def _reserve(self, run_id: str) -> None:
        if self.ledger is None and not self.population and self.private:
            self.ledger = Ledger(self._path(), create=True)
        if self.ledger is None:
            return
        purpose = "tuning" if self.tuning_trial else "release"
        plan = self.plan
        if not self.private:
            self.ledger.reserve_non_private(
                population=self.population, run_id=run_id, adjacency=plan.adjacency.value, purpose=purpose
            )
            return
        self.ledger.reserve(
            population=self.population,  # None: an unassigned run, found by its output folder
            output_dir=None if self.population else str(Path(self.output_dir).resolve()),
            run_id=run_id,
            epsilon=plan.epsilon,
            delta=plan.delta,
            accountant=plan.accountant.value,
            adjacency=plan.adjacency.value,
            protected_unit=self.privacy.protected_unit.value,
            unit_key=self.privacy.unit_key,
            events=[ledger_event(plan)],
            purpose=purpose,
        )

    def settle_discarded(self, info: CheckpointInfo, *, ran: int | None, log) -> None:
        """``--overwrite`` discards a resumable run's folder: close that run's pending charge at its reserved ε (the
        plan's T steps). Where a signal or a failure stopped it is a function of wall-clock time and the realised
        batches, so the charge never depends on it; only a stop by the DP stop rule (its steps are DP outputs,
        ``ran`` past the checkpoint) keeps the charge of the steps it took, which :func:`dplora.ledger.recovery.
        abandoned_epsilon` gives."""
        from dplora.ledger.recovery import abandoned_epsilon

        ledger = self.ledger or self._discard_ledger
        if ledger is None:
            return
        try:
            charge = ledger.charge(info.run_id)
        except BadInputError:
            return
        if charge.status != "pending":
            return
        eps, how = abandoned_epsilon(charge, info, ran)
        ledger.settle(info.run_id, epsilon_spent=str(eps), status="failed")
        log(f"note: run {info.run_id} discarded: its ledger charge is settled at {how} ε={float(eps):.4f}")

    def fail(self, spent: float, *, resumable: bool) -> None:
        """Settle the charge at ε spent for the steps taken (a resumable run's charge stays pending instead)."""
        if self.ledger is not None and not resumable:
            self.ledger.settle(self.run_id, epsilon_spent=spent, status="failed")

    def settle(self, spent: float, *, record: Path) -> None:
        """Settle at ε spent; record the signed release ``record`` by its sha256 (a DP run's, unless a sweep trial
        signs it later)."""
        if self.ledger is None:
            return
        self.ledger.settle(self.run_id, epsilon_spent=spent, status="settled")
        if self.private and self.ledger_release:
            from dplora.data.digest import sha256_file

            self.ledger.record_release(
                run_id=self.run_id,
                record_sha256=sha256_file(record),
                epsilon=spent,
                delta=self.plan.delta,
                label="final",
            )
