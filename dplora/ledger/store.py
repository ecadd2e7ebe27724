"""Privacy budget ledger: caps and charges per protected population, in one SQLite file.

Every DP run on a named protected population spends (ε, δ): ε is unitless, δ a probability.
Charges on one population compose by basic composition (Dwork & Roth 2014, Thm 3.16): the total
is the sum of the ε's and the sum of the δ's, computed exactly with ``decimal.Decimal`` and
stored as TEXT (never REAL), so 1.1 + 1.1 + 1.0 = 3.2 is refused at a cap of 3.0 while
1.0 + 1.0 + 1.0 = 3.0 fits. Every write is one ``BEGIN IMMEDIATE`` transaction, so concurrent
processes can neither overspend a cap nor lose a record.

A charge's ε is the reserved ε while ``pending`` (a killed run stays there), then what the run
reports when ``settled`` or ``failed`` (a failed run touched private data). Releases of a run are
post-processing, not new charges: the charge is raised to the ε of its latest released checkpoint
(ε grows with training steps, so that is the largest released ε) and never lowered below it.
A non-private control run (``privacy.enabled: false``) is charged ε = ∞, δ = 0 (stored as ``Infinity``).

Units compose only with like units (schema 2): a cap is pinned to one protected unit (row, ticket, user) and one
adjacency, and a charge with another unit or adjacency is refused, naming both (by group privacy a row-level ε is
worth up to k·ε per user of k rows, so the sum would understate it). Populations of a schema-1 ledger are
migrated as "unit unknown": their old charges count by basic composition, and new charges wait until
``set-cap`` pins the unit. A cap is also pinned to the **unit key** (schema 4): the column that names
the unit (``privacy.unit_key``, e.g. ``customer_id``; none at row level). A population pinned to ``user`` keyed
by ``customer_id`` refuses a run keyed by ``ticket_id`` (really ticket level: by group privacy worth k·ε for a
customer with k tickets), naming both keys. Populations of a schema-3 ledger are migrated as "unit key unknown"
(row-level ones need no key and keep composing): their old charges count by basic composition, never composed
with new ones, and the next charge waits until ``set-cap`` re-pins the population with an explicit
``--unit-key``. Each charge stores the mechanisms composed into it as events (JSON: the DP-SGD event
with q, σ, T, adjacency and accountant; a Gaussian or Laplace count). The population's total is stated twice
at the same total δ = Σδ: basic composition, and the stored events composed by dp_accounting's PLD (and
Opacus RDP under add/remove; :func:`dplora.accounting.composition.compose_events`), with charges without
composable events added by basic composition. The cap is checked against the tighter of the two.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from decimal import Context, Decimal, Inexact, InvalidOperation, Overflow
from pathlib import Path

from dplora.contract.spec import MAX_PATH_CHARS
from dplora.errors import BadInputError, PlanRefusedError

LEDGER_ENV = "DPLORA_LEDGER"
SCHEMA_VERSION = 4
UNASSIGNED = ""  # the population column of an unassigned run: never a valid population name (see _name)
UNITS = ("row", "ticket", "user")
ADJACENCIES = ("add_remove", "replace_one")
UNKNOWN_UNIT = "unit unknown"
UNKNOWN_KEY = "key unknown"  # a population or charge from before unit keys were recorded (schema 3 and older)
NO_KEY = ""  # the stored unit key of a row-level pin or charge: row level has none
PURPOSES = ("release", "tuning")
INFINITE = Decimal("Infinity")  # the ε of a non-private run (privacy.enabled: false)
NON_PRIVATE_ACCOUNTANT = "none (not differentially private)"
# Sums must be exact: far more digits than any validated input needs, and any rounding raises.
_EXACT = Context(prec=400, traps=[InvalidOperation, Inexact, Overflow])
_NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,200}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS populations (
    name TEXT PRIMARY KEY, epsilon_max TEXT NOT NULL, delta_max TEXT NOT NULL, updated_at TEXT NOT NULL,
    protected_unit TEXT, adjacency TEXT, unit_key TEXT);
CREATE TABLE IF NOT EXISTS charges (
    run_id TEXT PRIMARY KEY, population TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
    reserved_epsilon TEXT NOT NULL, spent_epsilon TEXT,
    status TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'failed')),
    purpose TEXT NOT NULL CHECK (purpose IN ('release', 'tuning')),
    accountant TEXT NOT NULL, adjacency TEXT NOT NULL, created_at TEXT NOT NULL, settled_at TEXT,
    protected_unit TEXT, events TEXT, output_dir TEXT, unit_key TEXT);
CREATE INDEX IF NOT EXISTS charges_population ON charges (population);
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL REFERENCES charges (run_id),
    record_sha256 TEXT NOT NULL, epsilon TEXT NOT NULL, delta TEXT NOT NULL, label TEXT NOT NULL,
    created_at TEXT NOT NULL, UNIQUE (run_id, record_sha256));
"""


def default_ledger_path() -> Path:
    """Return ``$DPLORA_LEDGER``, else ``{$XDG_DATA_HOME or ~/.local/share}/dplora/ledger.sqlite3``."""
    if os.environ.get(LEDGER_ENV):
        return Path(os.environ[LEDGER_ENV]).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "dplora" / "ledger.sqlite3"


class LedgerError(BadInputError):
    """The ledger database is corrupted, locked or unreadable (exit code 2)."""


@dataclass(frozen=True)
class Charge:
    """One run's charge on a population: ``epsilon`` (unitless) charged now, ``delta`` a probability."""

    run_id: str
    population: str
    epsilon: Decimal
    delta: Decimal
    status: str
    purpose: str
    accountant: str
    adjacency: str
    created_at: str
    settled_at: str | None
    reserved_epsilon: Decimal | None = None
    protected_unit: str | None = None  # None: a charge from a schema-1 ledger (unit unknown)
    events: tuple | None = None  # the mechanisms composed into the charge (dicts); None: unknown
    output_dir: str | None = None  # where the run wrote (recorded for unassigned runs, schema 3)
    unit_key: str | None = None  # the column naming the unit ("" at row level); None: unknown (before schema 4)

    @property
    def unassigned(self) -> bool:
        """True for a run without ``privacy.population``: charged on its own, never composed with anything."""
        return self.population is None

    def to_dict(self) -> dict:
        """Return a JSON-ready dict; Decimals become exact strings."""
        out = {k: str(v) if isinstance(v, Decimal) else v for k, v in asdict(self).items()}
        out["events"] = None if self.events is None else [dict(e) for e in self.events]
        return out


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _path_text(value: object) -> str:
    """An output folder as stored: any path the contract accepts (up to 4,096 characters, no control characters)."""
    text = str(value)
    if not text or len(text) > MAX_PATH_CHARS or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise BadInputError(f"output_dir must be a one-line path of at most {MAX_PATH_CHARS} characters")
    return text


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not _NAME_RE.match(value) or value != value.strip():
        raise BadInputError(f"{what} must be a non-empty one-line string without surrounding spaces")
    return value


def _dec(value: object, what: str, *, positive: bool = True, below_one: bool = False) -> Decimal:
    """Convert str, int, Decimal or float (via ``str()``) to a finite, in-range Decimal."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise BadInputError(f"{what} must be a number, got {type(value).__name__}")
    try:
        d = value if isinstance(value, Decimal) else Decimal(str(value).strip())
    except InvalidOperation:
        raise BadInputError(f"{what} must be a number, got {value!r}") from None
    if not d.is_finite():
        raise BadInputError(f"{what} must be finite, got {value!r}")
    if (d <= 0) if positive else (d < 0):
        raise BadInputError(f"{what} must be {'> 0' if positive else '>= 0'}, got {d}")
    if below_one and d >= 1:
        raise BadInputError(f"{what} must be < 1 (a probability), got {d}")
    if d and (d.adjusted() > 12 or d.normalize().as_tuple().exponent < -60):
        raise BadInputError(f"{what} must be at most 1e12 with at most 60 decimal places, got {d}")
    return d


def _is_infinite(value: object) -> bool:
    """+∞ as a float, a Decimal or a string ("inf", "Infinity"): the ε of a non-private run."""
    if isinstance(value, bool) or not isinstance(value, str | int | float | Decimal):
        return False
    try:
        return Decimal(str(value).strip()) == INFINITE
    except InvalidOperation:
        return False


def _sum(values: Iterable[Decimal]) -> Decimal:
    total = Decimal(0)
    for v in values:
        total = _EXACT.add(total, v)
    return total


def _over(pop: str, cap: tuple[Decimal, Decimal], spent: tuple[Decimal, Decimal], eps, delta) -> str:
    """Return the one-line reason spent + planned exceeds the cap, or '' if it fits."""
    reasons = []
    for sym, s, p, c in (("ε", spent[0], eps, cap[0]), ("δ", spent[1], delta, cap[1])):
        if (total := _EXACT.add(s, p)) > c:
            reasons.append(f"spent {sym}={s} + planned {sym}={p} = {total} exceeds the cap {sym}_max={c}")
    return f"population {pop!r}: " + "; ".join(reasons) if reasons else ""


def _charge_columns(
    run_id, epsilon, delta, accountant, adjacency, protected_unit, events, purpose, unit_key=None
) -> dict:
    """The checked columns of a DP charge (:meth:`Ledger.reserve`, on a population or unassigned).

    Raises:
        BadInputError: a bad name or value, or an unknown purpose.
    """
    run_id = _name(run_id, "run_id")
    eps, dlt = _dec(epsilon, "epsilon"), _dec(delta, "delta", positive=False, below_one=True)
    accountant, adjacency = _name(accountant, "accountant"), _adjacency(adjacency)
    unit, ev = _unit(protected_unit), _events(events, adjacency)
    key = _key(unit, unit_key)
    if purpose not in PURPOSES:
        raise BadInputError(f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}")
    return {
        "run_id": run_id,
        "epsilon": eps,
        "delta": dlt,
        "purpose": purpose,
        "accountant": accountant,
        "adjacency": adjacency,
        "protected_unit": unit,
        "unit_key": key,
        "events": ev,
    }


def _refuse_duplicate(c, run_id: str, path) -> None:
    """BadInputError if ``run_id`` already has a charge (checked before any other refusal)."""
    if c.execute("SELECT 1 FROM charges WHERE run_id=?", (run_id,)).fetchone():
        raise BadInputError(f"run {run_id!r} already has a charge in ledger {path}")


def _no_cap(pop: str) -> PlanRefusedError:
    cmd = f"dplora ledger set-cap {shlex.quote(pop)} --epsilon E --delta D --unit U [--unit-key KEY] --adjacency A"
    return PlanRefusedError(f"population {pop!r} has no privacy cap: run `{cmd}` first")


def _to_charge(row: sqlite3.Row) -> Charge:
    dec = ("epsilon", "delta", "reserved_epsilon")
    values = {f.name: Decimal(row[f.name]) if f.name in dec else row[f.name] for f in fields(Charge)}
    values["events"] = None if row["events"] is None else tuple(json.loads(row["events"]))
    if values["population"] == UNASSIGNED:
        values["population"] = None
    return Charge(**values)


def _unit(value: object) -> str:
    if value not in UNITS:
        raise BadInputError(f"protected unit must be one of {', '.join(UNITS)}, got {value!r}")
    return str(value)


def _key(unit: str, value: object) -> str:
    """The stored unit key of a pin or charge: :data:`NO_KEY` at row level, else the column's name.

    Raises:
        BadInputError: a key at row level, or none (or not a one-line name) above it.
    """
    if unit == "row":
        if value not in (None, NO_KEY):
            raise BadInputError("protected unit row has no unit key: drop --unit-key (each row is its own unit)")
        return NO_KEY
    if value in (None, NO_KEY):
        raise BadInputError(
            f"protected unit {unit} needs a unit key (the column that names the unit, e.g. customer_id): pass "
            "--unit-key KEY, the contract's privacy.unit_key"
        )
    return _name(value, "unit key")


def _key_text(key: str | None) -> str:
    """How a stored unit key reads in ``ledger show``."""
    return UNKNOWN_KEY if key is None else ("none (row level)" if key == NO_KEY else key)


def _adjacency(value: object) -> str:
    value = str(value).replace("-", "_") if isinstance(value, str) else value
    if value not in ADJACENCIES:
        raise BadInputError(f"adjacency must be one of {', '.join(ADJACENCIES)}, got {value!r}")
    return value


def _events(events: object, adjacency: str) -> str | None:
    """Validate the events of a charge (see :func:`dplora.accounting.composition.compose_events`) as JSON text."""
    if events is None:
        return None
    from dplora.accounting.composition import validate_events

    try:
        return json.dumps(validate_events(list(events), adjacency), sort_keys=True)
    except (TypeError, ValueError) as err:
        raise BadInputError(f"bad ledger events: {err}") from None


def _pin_problem(pop: str, pinned: tuple, unit: str, key: str, adjacency: str) -> str:
    """Why a charge of (unit, unit key, adjacency) may not join population ``pop`` ('' when it may); ``pinned`` is
    the population's (unit, unit key, adjacency), None where unknown."""
    p_unit, p_key, p_adj = pinned
    key_opt = "" if key == NO_KEY else f" --unit-key {shlex.quote(key)}"
    cmd = f"dplora ledger set-cap {shlex.quote(pop)} --epsilon E --delta D --unit {unit}{key_opt}"
    cmd += f" --adjacency {adjacency}"
    if p_unit is None or p_adj is None:
        return (
            f"population {pop!r} has {UNKNOWN_UNIT} (a ledger from before units were recorded; its old charges "
            f"count by basic composition): pin it with `{cmd}` first"
        )
    if (p_unit, p_adj) != (unit, adjacency):
        return (
            f"population {pop!r} is capped for protected unit {p_unit}, adjacency {p_adj}; this charge is for "
            f"protected unit {unit}, adjacency {adjacency}: ε of different units or adjacencies do not add "
            "(use another population)"
        )
    if p_key is None:
        return (
            f"population {pop!r} has unit key unknown (a ledger from before unit keys were recorded; its old charges "
            f"count by basic composition, never composed with new ones): re-pin it with an explicit key, `{cmd}`, "
            "first"
        )
    if p_key != key:
        return (
            f"population {pop!r} is capped for protected unit {p_unit} with unit key {p_key}; this charge is keyed "
            f"by unit key {key}: units named by another column are other units (a run keyed by a finer column is "
            f"worth k·ε per {p_key} of k such units), so their ε do not add (use another population)"
        )
    return ""


class Ledger:
    """A privacy budget ledger in one SQLite file (WAL mode), safe across processes (one per thread).

    Args:
        path: The SQLite file, created with its parent directory if missing (unless ``create`` is
            False). An existing file is never deleted, recreated or overwritten.
        timeout_s: Seconds to wait for another process's write lock before giving up.
        create: If False, a missing file raises LedgerError instead of being created.

    Raises:
        LedgerError: Not a SQLite database, not a dplora ledger, locked, or cannot be opened.
    """

    def __init__(self, path: Path, *, timeout_s: float = 10.0, create: bool = True) -> None:
        self.path = Path(path).expanduser()
        if not create and not self.path.is_file():
            raise LedgerError(
                f"no ledger at {self.path}: create it with `dplora ledger set-cap POPULATION "
                "--epsilon E --delta D` (or name another ledger: --ledger on train and budget, --db on ledger "
                "commands, or $DPLORA_LEDGER)"
            )
        if self.path.is_dir():
            raise LedgerError(f"ledger {self.path} is a directory: pass a file path")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(str(self.path), timeout=timeout_s, isolation_level=None)
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"cannot open ledger {self.path} ({e}): check the path and permissions") from e
        try:
            with self._errors():
                self._init_schema()
        except BaseException:
            self._conn.close()
            raise

    def _init_schema(self) -> None:
        # Read first: a corrupted file fails here, before anything could be written to it.
        tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if tables and "schema_version" not in tables:
            raise LedgerError(f"{self.path} is a SQLite database but not a dplora ledger: pass another --db")
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        if "schema_version" not in tables:
            with self._write() as c:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    c.execute(statement)
                if c.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 0:
                    c.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
        version = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        if version == 1:
            self._migrate_1_to_2()
            version = 2
        if version == 2:
            self._migrate_2_to_3()
            version = 3
        if version == 3:
            self._migrate_3_to_4()
            version = SCHEMA_VERSION
        if version != SCHEMA_VERSION:
            raise LedgerError(f"ledger {self.path} has schema {version}, dplora reads {SCHEMA_VERSION}: upgrade")

    def _migrate_1_to_2(self) -> None:
        """Schema 1 → 2 in one transaction: populations become "unit unknown", old charges have no events."""
        with self._write() as c:
            if c.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] != 1:
                return  # another process migrated it first
            for table, column in (
                ("populations", "protected_unit"),
                ("populations", "adjacency"),
                ("charges", "protected_unit"),
                ("charges", "events"),
            ):
                c.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
            c.execute("UPDATE schema_version SET version=2")

    def _migrate_2_to_3(self) -> None:
        """Schema 2 → 3 in one transaction: charges gain ``output_dir`` (unassigned runs); no charge changes."""
        with self._write() as c:
            if c.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] != 2:
                return  # another process migrated it first
            c.execute("ALTER TABLE charges ADD COLUMN output_dir TEXT")
            c.execute("UPDATE schema_version SET version=3")

    def _migrate_3_to_4(self) -> None:
        """Schema 3 → 4 in one transaction: populations and charges gain ``unit_key``. Row-level pins and charges
        get :data:`NO_KEY` (row level has no key); every other population and charge stays NULL, "key unknown":
        old charges then count by basic composition and the population takes no charge until re-pinned."""
        with self._write() as c:
            if c.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] != 3:
                return  # another process migrated it first
            c.execute("ALTER TABLE populations ADD COLUMN unit_key TEXT")
            c.execute("ALTER TABLE charges ADD COLUMN unit_key TEXT")
            c.execute("UPDATE populations SET unit_key=? WHERE protected_unit='row'", (NO_KEY,))
            c.execute("UPDATE charges SET unit_key=? WHERE protected_unit='row'", (NO_KEY,))
            c.execute("UPDATE schema_version SET version=4")

    def close(self) -> None:
        """Close the database connection."""
        self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Translate sqlite3 errors into one-line LedgerErrors naming the file."""
        try:
            yield
        except sqlite3.DatabaseError as e:
            msg = str(e).lower()
            if "locked" in msg or "busy" in msg:
                raise LedgerError(f"ledger {self.path} is locked by another process; retry") from e
            if "not a database" in msg or "malformed" in msg or "encrypted" in msg:
                raise LedgerError(
                    f"ledger {self.path} is not a valid SQLite database (corrupted?): "
                    "restore it from backup; dplora never overwrites it"
                ) from e
            raise LedgerError(f"ledger {self.path}: {e}; check the file and its permissions") from e

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed on success, rolled back on any error."""
        with self._errors():
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot."""
        with self._errors():
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    @staticmethod
    def _cap(c: sqlite3.Connection, pop: str) -> tuple[Decimal, Decimal] | None:
        row = c.execute("SELECT epsilon_max, delta_max FROM populations WHERE name=?", (pop,)).fetchone()
        return (Decimal(row[0]), Decimal(row[1])) if row else None

    @staticmethod
    def _spent(c: sqlite3.Connection, pop: str) -> tuple[Decimal, Decimal]:
        rows = c.execute("SELECT epsilon, delta FROM charges WHERE population=?", (pop,)).fetchall()
        return _sum(Decimal(r[0]) for r in rows), _sum(Decimal(r[1]) for r in rows)

    @staticmethod
    def _pinned(c: sqlite3.Connection, pop: str) -> tuple[str | None, str | None]:
        row = c.execute("SELECT protected_unit, adjacency FROM populations WHERE name=?", (pop,)).fetchone()
        return (row[0], row[1]) if row else (None, None)

    @staticmethod
    def _pin(c: sqlite3.Connection, pop: str) -> tuple[str | None, str | None, str | None]:
        """(protected unit, unit key, adjacency) of a population's pin; None for what is unknown or unset."""
        sql = "SELECT protected_unit, unit_key, adjacency FROM populations WHERE name=?"
        row = c.execute(sql, (pop,)).fetchone()
        return (row[0], row[1], row[2]) if row else (None, None, None)

    @staticmethod
    def _total(c: sqlite3.Connection, pop: str, planned: tuple[Decimal, Decimal, str | None] | None = None) -> dict:
        """Basic and composed totals of a population's charges (plus ``planned`` = (ε, δ, events JSON))."""
        from dplora.accounting.composition import ledger_total

        key = Ledger._pin(c, pop)[1]
        rows = c.execute("SELECT epsilon, delta, events, unit_key FROM charges WHERE population=?", (pop,)).fetchall()
        # a charge's events compose only with charges of the pinned, known key: one of unknown key counts by basic
        # composition (it may be of another unit named by another column)
        items = [
            (Decimal(e), Decimal(d), None if ev is None or key is None or k != key else json.loads(ev))
            for e, d, ev, k in rows
        ]
        if planned is not None:
            items.append((planned[0], planned[1], None if planned[2] is None else json.loads(planned[2])))
        adjacency = Ledger._pinned(c, pop)[1] or "add_remove"
        return ledger_total(items, adjacency)

    def _refusal(self, c, pop: str, cap, eps: Decimal, dlt: Decimal, events: str | None) -> str:
        """Why spent + planned exceeds the cap under basic composition and under the composed total ('' if not)."""
        reason = _over(pop, cap, self._spent(c, pop), eps, dlt)
        if not reason or events is None:
            return reason
        total = self._total(c, pop, (eps, dlt, events))  # only when basic composition does not fit
        composed = total["composed"]
        if composed is None or composed["epsilon"] is None:
            return reason
        e, d = Decimal(repr(composed["epsilon"])), Decimal(total["basic"]["delta"])
        if e <= cap[0] and d <= cap[1]:
            return ""
        return (
            f"{reason}; composed ({composed['method_short']}) the total with the planned charge is "
            f"ε={composed['epsilon']:.4f} at δ={d}, also over the cap"
        )

    def _row(self, c: sqlite3.Connection, run_id: str) -> sqlite3.Row:
        cur = c.cursor()
        cur.row_factory = sqlite3.Row
        row = cur.execute("SELECT * FROM charges WHERE run_id=?", (run_id,)).fetchone()
        if row is None:
            raise BadInputError(f"run {run_id!r} has no charge in ledger {self.path}: reserve it first")
        return row

    def set_cap(
        self,
        population: str,
        *,
        epsilon_max: object,
        delta_max: object,
        protected_unit: str,
        adjacency: str,
        unit_key: str | None = None,
    ) -> str:
        """Set (or replace) a population's cap, pinned to one protected unit, unit key and adjacency.

        Lowering a cap below what is spent is allowed (the charges are history: they cannot be undone) and the
        returned line says what is over and by how much; every later run on the population is then refused.
        Pinning a "unit unknown" (schema 1) or "key unknown" (schema 3) population is allowed (its old charges
        keep counting by basic composition); re-pinning to another unit, unit key or adjacency is refused once
        charges of the pinned one exist.

        Args:
            population: Name of the protected population, e.g. ``"support-tickets-eu"``.
            epsilon_max: Total ε allowed (unitless), finite and > 0.
            delta_max: Total δ allowed (probability), in (0, 1).
            protected_unit: ``"row"``, ``"ticket"`` or ``"user"``: what one neighbour differs by.
            adjacency: ``"add_remove"`` or ``"replace_one"``.
            unit_key: the column that names the unit (the contract's ``privacy.unit_key``, e.g.
                ``"customer_id"``); required for ``ticket`` and ``user``, None for ``row``.

        Returns:
            '' when what is spent fits the new cap, else one line: spent (basic and composed ε, Σδ), the cap, and
            by how much each is over.

        Raises:
            BadInputError: A bad name or value, a key at row level or none above it, or a re-pin over existing
                charges of another unit, unit key or adjacency.
        """
        population = _name(population, "population")
        eps, delta = _dec(epsilon_max, "epsilon_max"), _dec(delta_max, "delta_max", below_one=True)
        unit, adj = _unit(protected_unit), _adjacency(adjacency)
        key = _key(unit, unit_key)
        with self._write() as c:
            sql = "SELECT DISTINCT unit_key FROM charges WHERE population=? AND unit_key IS NOT NULL AND unit_key != ?"
            for (other,) in c.execute(sql, (population, key)).fetchall():  # charges of a known, other key
                raise BadInputError(
                    f"population {population!r} has charges keyed by {_key_text(other)}: it cannot be re-pinned to "
                    f"unit key {_key_text(key)} (use another population)"
                )
            sql = "SELECT protected_unit, adjacency FROM charges WHERE population=?"
            rows = {tuple(r) for r in c.execute(sql, (population,))}
            # schema-1 charges stored the adjacency but no unit: their adjacency still binds the pin
            others = {r for r in rows if r[0] is not None and r != (unit, adj)}
            others |= {r for r in rows if r[0] is None and r[1] is not None and r[1] != adj}
            for other in sorted(others, key=str):
                raise BadInputError(
                    f"population {population!r} has charges for protected unit {other[0] or 'unknown'}, adjacency "
                    f"{other[1]}: it cannot be re-pinned to protected unit {unit}, adjacency {adj} (use another "
                    "population)"
                )
            c.execute(
                "INSERT INTO populations (name, epsilon_max, delta_max, updated_at, protected_unit, adjacency, "
                "unit_key) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
                "epsilon_max=excluded.epsilon_max, delta_max=excluded.delta_max, updated_at=excluded.updated_at, "
                "protected_unit=excluded.protected_unit, adjacency=excluded.adjacency, unit_key=excluded.unit_key",
                (population, str(eps), str(delta), _now(), unit, adj, key),
            )
            return self._over_cap_line(c, population)

    def _over_cap_line(self, c: sqlite3.Connection, pop: str) -> str:
        """'' if the population's spend fits its cap, else what is over and by how much (ε: the tighter total)."""
        cap = self._cap(c, pop)
        if cap is None or not c.execute("SELECT 1 FROM charges WHERE population=?", (pop,)).fetchone():
            return ""
        (s_eps, s_delta), total = self._spent(c, pop), self._total(c, pop)
        tight = Decimal(repr(total["epsilon"])) if total["epsilon"] is not None else s_eps
        tight = min(tight, s_eps)
        parts = []
        if tight > cap[0]:
            over = "∞" if tight.is_infinite() else str(_EXACT.subtract(tight, cap[0]))
            parts.append(f"ε spent {s_eps} (basic), {total['epsilon']} (tightest) is over ε_max={cap[0]} by {over}")
        if s_delta > cap[1]:
            parts.append(f"δ spent {s_delta} is over δ_max={cap[1]} by {_EXACT.subtract(s_delta, cap[1])}")
        if not parts:
            return ""
        return f"population {pop!r} is over its new cap: " + "; ".join(parts) + "; every later run on it is refused"

    def pinned(self, population: str) -> tuple[str | None, str | None]:
        """Return ``(protected_unit, adjacency)`` of a population; ``(None, None)`` when unit unknown or no cap."""
        with self._read() as c:
            return self._pinned(c, population)

    def unit_key(self, population: str) -> str | None:
        """Return the population's pinned unit key: the column's name, ``""`` at row level, None when unknown
        (a population from before schema 4) or without a cap."""
        with self._read() as c:
            return self._pin(c, population)[1]

    def total(self, population: str) -> dict:
        """The population's total at δ = Σδ, by basic composition and by composing the stored events.

        Returns:
            :func:`dplora.accounting.composition.ledger_total`'s dict: ``basic`` and ``composed`` (ε, δ, method),
            and ``epsilon``: the tighter valid ε.
        """
        with self._read() as c:
            return self._total(c, population)

    def cap(self, population: str) -> tuple[Decimal, Decimal] | None:
        """Return ``(epsilon_max, delta_max)`` of a population, or None if no cap is set."""
        with self._read() as c:
            return self._cap(c, population)

    def spent(self, population: str) -> tuple[Decimal, Decimal]:
        """Return the exact ``(Σε, Σδ)`` over all charges (pending, settled, failed) of a population."""
        with self._read() as c:
            return self._spent(c, population)

    def check(
        self,
        population: str,
        *,
        epsilon: object,
        delta: object,
        protected_unit: str | None = None,
        adjacency: str | None = None,
        events: list[dict] | None = None,
        unit_key: str | None = None,
    ) -> None:
        """Refuse a planned (ε, δ) that would push the population over its cap, or that is of another unit or key.

        Args:
            population: Name of the protected population.
            epsilon: Planned ε (unitless, > 0).
            delta: Planned δ (probability, in [0, 1)).
            protected_unit, adjacency: the plan's; checked against the population's pin when given.
            events: the plan's mechanisms (see :meth:`reserve`); with them the composed total is used too.
            unit_key: the plan's ``privacy.unit_key`` (None at row level); checked with ``protected_unit``.

        Raises:
            PlanRefusedError: No cap is set, another unit/unit key/adjacency, a "key unknown" population, or
                spent + planned exceeds the cap both by basic composition and composed.
            BadInputError: A bad name or value (also a unit key at row level, or none above it).
        """
        population = _name(population, "population")
        eps, dlt = _dec(epsilon, "epsilon"), _dec(delta, "delta", positive=False, below_one=True)
        adj = None if adjacency is None else _adjacency(adjacency)
        ev = None if events is None or adj is None else _events(events, adj)
        with self._read() as c:
            cap = self._cap(c, population)
            if cap is None:
                raise _no_cap(population)
            if protected_unit is not None and adj is not None:
                unit = _unit(protected_unit)
                if reason := _pin_problem(population, self._pin(c, population), unit, _key(unit, unit_key), adj):
                    raise PlanRefusedError(reason)
            reason = self._refusal(c, population, cap, eps, dlt, ev)
        if reason:
            raise PlanRefusedError(reason)

    def reserve(
        self,
        *,
        population: str | None,
        run_id: str,
        epsilon: object,
        delta: object,
        accountant: str,
        adjacency: str,
        protected_unit: str,
        events: list[dict] | None = None,
        purpose: str = "release",
        unit_key: str | None = None,
        output_dir: str | None = None,
    ) -> Charge:
        """Record a pending charge for a DP run about to touch private data: on a population, atomically checking
        its cap, unit and unit key first; without one (``population=None``), as an unassigned run.

        An unassigned run has its own protected unit, adjacency and events and is never composed with anything (no
        population total counts it, and no cap applies): ``ledger show`` lists each unassigned run on its own. It
        settles and records releases like any charge.

        Args:
            population: Name of the protected population; None: an unassigned run (``output_dir`` required).
            run_id: Unique id of the run (a training run or a hyperparameter-tuning trial).
            epsilon: ε to reserve (unitless, > 0): the run's planned total.
            delta: δ to reserve (probability, in [0, 1)).
            accountant: Accountant that computed ε, e.g. ``"rdp"`` or ``"prv"``.
            adjacency: Neighbouring relation, ``"add_remove"`` or ``"replace_one"``; must be the population's.
            protected_unit: ``"row"``, ``"ticket"`` or ``"user"``; must be the population's.
            events: every mechanism composed into the charge, e.g. ``[{"mechanism": "dp_sgd", "sample_rate": q,
                "noise_multiplier": σ, "steps": T, "adjacency": ..., "accountant": ...}]`` (also ``"gaussian"`` /
                ``"laplace"`` counts with ``noise_multiplier`` = noise scale / sensitivity); None: counted by
                basic composition only.
            purpose: ``"release"`` or ``"tuning"``; both count toward the cap alike.
            unit_key: the column naming the unit (``privacy.unit_key``); must be the population's; None at row
                level.
            output_dir: an unassigned run's output folder (absolute path), to find it again; only without a
                population.

        Returns:
            The pending charge (``population`` None for an unassigned run).

        Raises:
            PlanRefusedError: No cap, another unit, unit key or adjacency (naming both), a "unit unknown" or "key
                unknown" population, or the reservation would exceed the cap; nothing is written.
            BadInputError: Duplicate run_id, a bad name or value, or ``output_dir`` missing without a population
                (or given with one).
            LedgerError: The database is locked (after ``timeout_s``) or unreadable.
        """
        if population is not None:
            population = _name(population, "population")
            if output_dir is not None:
                raise BadInputError("output_dir is recorded for an unassigned run only (no population)")
        charge = _charge_columns(
            run_id, epsilon, delta, accountant, adjacency, protected_unit, events, purpose, unit_key
        )
        if population is None:
            if output_dir is None:
                raise BadInputError("an unassigned run (no population) needs its output_dir")
            output_dir = _path_text(output_dir)
            with self._write() as c:
                _refuse_duplicate(c, charge["run_id"], self.path)
                return self._insert_charge(c, population=UNASSIGNED, output_dir=output_dir, **charge)
        with self._write() as c:
            _refuse_duplicate(c, charge["run_id"], self.path)
            if (cap := self._cap(c, population)) is None:
                raise _no_cap(population)
            unit, key, adjacency = charge["protected_unit"], charge["unit_key"], charge["adjacency"]
            if reason := _pin_problem(population, self._pin(c, population), unit, key, adjacency):
                raise PlanRefusedError(reason)
            if reason := self._refusal(c, population, cap, charge["epsilon"], charge["delta"], charge["events"]):
                raise PlanRefusedError(reason)
            return self._insert_charge(c, population=population, **charge)

    def reserve_non_private(self, *, population: str, run_id: str, adjacency: str, purpose: str = "release") -> Charge:
        """Record a pending charge of ε = ∞, δ = 0 for a non-private run (``privacy.enabled: false``) on a population.

        A run without DP is (∞, 0)-DP at best; the charge shows that the population's data was used without a
        guarantee. It is recorded whether or not the population has a cap, and it is over any cap by construction:
        every later DP run on the population is refused by the cap check (basic composition of ∞).

        Args:
            population: Name of the protected population.
            run_id: Unique id of the run.
            adjacency: The contract's neighbouring relation (for the history only).
            purpose: ``"release"`` or ``"tuning"``.

        Returns:
            The pending charge (``epsilon`` is ``Decimal("Infinity")``).

        Raises:
            BadInputError: Duplicate run_id, or a bad name.
            LedgerError: The database is locked or unreadable.
        """
        population, run_id = _name(population, "population"), _name(run_id, "run_id")
        adjacency = _name(adjacency, "adjacency")
        if purpose not in PURPOSES:
            raise BadInputError(f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}")
        with self._write() as c:
            _refuse_duplicate(c, run_id, self.path)
            return self._insert_charge(
                c,
                run_id=run_id,
                population=population,
                epsilon=INFINITE,
                delta="0",
                purpose=purpose,
                accountant=NON_PRIVATE_ACCOUNTANT,
                adjacency=adjacency,
            )

    def _insert_charge(self, c, **columns) -> Charge:
        """INSERT one pending charge (``reserved_epsilon`` = ``epsilon``, ``created_at`` now) inside the caller's
        write transaction ``c``; ``columns`` are already checked (:func:`_charge_columns`). Returns it as read back.
        """
        columns = {**columns, "reserved_epsilon": columns["epsilon"], "status": "pending", "created_at": _now()}
        for key in ("epsilon", "delta", "reserved_epsilon"):
            columns[key] = str(columns[key])
        names, marks = ", ".join(columns), ", ".join("?" for _ in columns)  # column names are this module's own
        c.execute(f"INSERT INTO charges ({names}) VALUES ({marks})", tuple(columns.values()))
        return _to_charge(self._row(c, columns["run_id"]))

    def unassigned(self) -> list[Charge]:
        """Every unassigned run's charge (no population), oldest first: each stands alone, never summed."""
        with self._read() as c:
            cur = c.cursor()
            cur.row_factory = sqlite3.Row
            sql = "SELECT * FROM charges WHERE population=? ORDER BY created_at, rowid"
            return [_to_charge(r) for r in cur.execute(sql, (UNASSIGNED,)).fetchall()]

    def settle(self, run_id: str, *, epsilon_spent: object, status: str = "settled") -> Charge:
        """Charge a finished (``"settled"``) or failed/aborted (``"failed"``) run what it spent.

        A failed run touched private data, so it stays charged; a caller that does not know what
        it spent passes the reserved ε. The charge never drops below an already released ε.

        Args:
            run_id: The reserved run.
            epsilon_spent: ε the run spent (unitless, >= 0, <= the reserved ε); ∞ only for a non-private run.
            status: ``"settled"`` or ``"failed"``.

        Returns:
            The updated charge.

        Raises:
            BadInputError: Unknown or already settled run, bad status or value.
            PlanRefusedError: ``epsilon_spent`` exceeds the reserved ε.
        """
        if status not in ("settled", "failed"):
            raise BadInputError(f"status must be 'settled' or 'failed', got {status!r}")
        eps = INFINITE if _is_infinite(epsilon_spent) else _dec(epsilon_spent, "epsilon_spent", positive=False)
        with self._write() as c:
            row = self._row(c, run_id)
            if row["status"] != "pending":
                raise BadInputError(f"run {run_id!r} is already {row['status']}")
            if eps > (reserved := Decimal(row["reserved_epsilon"])):
                raise PlanRefusedError(f"run {run_id!r} spent ε={eps}, more than its reserved ε={reserved}")
            released = [Decimal(r[0]) for r in c.execute("SELECT epsilon FROM releases WHERE run_id=?", (run_id,))]
            c.execute(
                "UPDATE charges SET epsilon=?, spent_epsilon=?, status=?, settled_at=? WHERE run_id=?",
                (str(max([eps, *released])), str(eps), status, _now(), run_id),
            )
            return _to_charge(self._row(c, run_id))

    def record_release(
        self, *, run_id: str, record_sha256: str, epsilon: object, delta: object, label: str = ""
    ) -> None:
        """Record a release (e.g. a checkpoint) of an already charged run: post-processing, not a charge.

        The run's charge becomes the ε of its latest released checkpoint: raised to this release's
        ε if larger (at most the reserved ε, and only while the population's cap allows it), never
        lowered below what the run spent or released before. Recording a release twice is a no-op.

        Args:
            run_id: The charged run the release comes from.
            record_sha256: SHA-256 (hex) of the signed release record.
            epsilon: ε of the released checkpoint (unitless, > 0).
            delta: δ of the released checkpoint (probability, <= the run's reserved δ).
            label: A one-line label, e.g. ``"step-1200"``.

        Raises:
            BadInputError: Unknown run, bad digest or value, or the digest recorded with other values.
            PlanRefusedError: ε or δ above the reserved ones, or a raise over the cap.
        """
        sha = str(record_sha256).lower()
        if not _SHA_RE.match(sha):
            raise BadInputError(f"record_sha256 must be 64 hex digits, got {record_sha256!r}")
        eps, dlt = _dec(epsilon, "epsilon"), _dec(delta, "delta", positive=False, below_one=True)
        if label and not _NAME_RE.match(label):
            raise BadInputError("label must be one line")
        with self._write() as c:
            row = self._row(c, run_id)
            if eps > Decimal(row["reserved_epsilon"]) or dlt > Decimal(row["delta"]):
                raise PlanRefusedError(
                    f"release of run {run_id!r} has ε={eps}, δ={dlt}, above the reserved "
                    f"ε={row['reserved_epsilon']}, δ={row['delta']}"
                )
            sql = "SELECT epsilon, delta FROM releases WHERE run_id=? AND record_sha256=?"
            if old := c.execute(sql, (run_id, sha)).fetchone():
                if (Decimal(old[0]), Decimal(old[1])) != (eps, dlt):
                    raise BadInputError(f"release {sha[:12]} of run {run_id!r} is already recorded: ε={old[0]}")
                return
            if eps > (current := Decimal(row["epsilon"])):
                pop = row["population"]
                (s_eps, s_delta), cap = self._spent(c, pop), self._cap(c, pop)
                if cap and (reason := _over(pop, cap, (_EXACT.subtract(s_eps, current), s_delta), eps, 0)):
                    raise PlanRefusedError(f"release of run {run_id!r} refused: {reason}")
                c.execute("UPDATE charges SET epsilon=? WHERE run_id=?", (str(eps), run_id))
            c.execute(
                "INSERT INTO releases (run_id, record_sha256, epsilon, delta, label, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (run_id, sha, str(eps), str(dlt), label, _now()),
            )

    def charge(self, run_id: str) -> Charge:
        """Return one run's charge.

        Raises:
            BadInputError: the run has no charge in this ledger.
        """
        with self._read() as c:
            return _to_charge(self._row(c, run_id))

    # Where a run's resume checkpoint lives (for `ledger settle` and `ledger record-release`). A table of its
    # own, created on first use, so ledgers written before it keep schema 1 and older dplora still reads them.
    _CHECKPOINTS = "CREATE TABLE IF NOT EXISTS checkpoints (run_id TEXT PRIMARY KEY REFERENCES charges (run_id), "
    _CHECKPOINTS += "path TEXT NOT NULL)"

    def set_checkpoint_path(self, run_id: str, path: str) -> None:
        """Record the folder holding ``run_id``'s resume checkpoint (its ``<output_dir>.partial``)."""
        with self._write() as c:
            self._row(c, run_id)
            c.execute(self._CHECKPOINTS)
            c.execute("INSERT OR REPLACE INTO checkpoints (run_id, path) VALUES (?, ?)", (run_id, str(path)))

    def checkpoint_path(self, run_id: str) -> str | None:
        """The folder recorded by :meth:`set_checkpoint_path`, or None."""
        with self._read() as c:
            if not c.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='checkpoints'").fetchone():
                return None
            row = c.execute("SELECT path FROM checkpoints WHERE run_id=?", (run_id,)).fetchone()
        return row[0] if row else None

    def charges(self, population: str | None = None) -> list[Charge]:
        """Return all charges of populations (of one if given), oldest first; unassigned runs: :meth:`unassigned`."""
        with self._read() as c:
            cur = c.cursor()
            cur.row_factory = sqlite3.Row
            sql = (
                "SELECT * FROM charges WHERE population != ? AND (? IS NULL OR population=?) ORDER BY created_at, rowid"
            )
            return [_to_charge(r) for r in cur.execute(sql, (UNASSIGNED, population, population)).fetchall()]

    def releases(self, run_id: str | None = None, *, population: str | None = None) -> list[dict]:
        """Return recorded releases (of one run or population if given), oldest first, ε/δ as strings."""
        sql = (
            "SELECT r.run_id, c.population, r.record_sha256, r.epsilon, r.delta, r.label, r.created_at "
            "FROM releases r JOIN charges c ON c.run_id = r.run_id WHERE (? IS NULL OR r.run_id=?) "
            "AND (? IS NULL OR c.population=?) ORDER BY r.id"
        )
        keys = ("run_id", "population", "record_sha256", "epsilon", "delta", "label", "created_at")
        with self._read() as c:
            rows = c.execute(sql, (run_id, run_id, population, population)).fetchall()
        return [dict(zip(keys, r, strict=True)) for r in rows]

    def populations(self) -> list[dict]:
        """Return each population's cap, exact spend and what is left (negative after a lowered cap).

        Returns:
            Dicts with ``name``, ``epsilon_max``, ``delta_max``, ``epsilon_spent``, ``delta_spent``,
            ``epsilon_left``, ``delta_left`` (strings of Decimals; None without a cap), ``protected_unit``,
            ``unit_key`` (the column, ``"none (row level)"`` or ``"key unknown"``), ``adjacency``, the composed
            and tightest ε, and ``over_cap``.
        """
        out = []
        with self._read() as c:
            names = c.execute(
                "SELECT name FROM populations UNION SELECT population FROM charges WHERE population != ? ORDER BY 1",
                (UNASSIGNED,),
            )
            for (name,) in names.fetchall():
                cap, spent = self._cap(c, name), self._spent(c, name)
                left = [_EXACT.subtract(m, s) for m, s in zip(cap, spent, strict=True)] if cap else [None] * 2
                vals = [*(cap or (None, None)), *spent, *left]
                keys = (
                    "epsilon_max",
                    "delta_max",
                    "epsilon_spent",
                    "delta_spent",
                    "epsilon_left",
                    "delta_left",
                )
                row = {
                    "name": name,
                    **{k: None if v is None else str(v) for k, v in zip(keys, vals, strict=True)},
                }
                unit, key, adj = self._pin(c, name)
                total = self._total(c, name)
                composed = total["composed"] or {}
                row |= {
                    "protected_unit": unit or UNKNOWN_UNIT,
                    "unit_key": _key_text(key) if unit else UNKNOWN_KEY,
                    "adjacency": adj or UNKNOWN_UNIT,
                    "epsilon_composed": composed.get("epsilon"),
                    "composition": composed.get("method") or composed.get("skipped"),
                    "composed_by": composed.get("method_short"),
                    "epsilon_tightest": total["epsilon"],
                }
                over = bool(cap) and (total["epsilon"] > float(cap[0]) or left[1] < 0)
                out.append(row | {"over_cap": over})
        return out
