"""Per-unit clipping of flat per-example gradients, with memory bounded by the physical batch.

One logical step (Abadi et al. 2016, Alg. 1; units as in Charles et al. 2024, arXiv 2407.07737) sees the records of
its sampled units in physical batches; each batch arrives as G (B, P): row i is record i's gradient over all P
trainable LoRA parameters, flat (from :class:`dplora.engine.fastclip.FlatLoRAGrads` or
:func:`dplora.engine.perexample.opacus_flat`). The records
of a unit are contiguous, in non-decreasing unit id. :class:`UnitClipAccumulator` sums each unit's rows (optionally
weighted, e.g. 1/records for a per-unit mean), clips the unit's vector to C in flat L2 and adds it to one running
clipped sum (P,). A unit that continues into the next physical batch keeps ONE open running row (P,) until its
last record; nothing of size (units, P) exists. :func:`dplora.mechanism.noise.privatize` then adds N(0, σ²C²)
once and divides by the public normalizer; :func:`dplora.engine.perexample.assign_flat_grads` makes each
parameter's ``.grad`` a view of the result.
"""

from __future__ import annotations

import torch

from dplora.errors import TrainingFailedError

EPS = 1e-6  # clip factor min(1, C / (norm + EPS)), as Opacus


class UnitClipAccumulator:
    """Sum of per-unit clipped gradients over one logical step: state is two vectors of P floats.

    Args:
        num_params: P, the columns of every G given to :meth:`add`.
        max_grad_norm: C > 0, the flat L2 bound on each unit's contribution.
        device: where the sums live (the device of G).
        keep_norms: keep each complete unit's norm (one float per unit) for :meth:`finish`.
        normalize_gamma: γ > 0 for ``privacy.clipping: normalize`` (a fixed public constant), else None (clip).

    Each unit u contributes min(1, C / (‖v_u‖ + 1e-6)) · v_u with v_u = Σ_{records i of u} w_i g_i (w_i = 1
    without ``row_weight``), so removing or adding one unit moves the sum by at most C (add/remove adjacency).
    With ``normalize_gamma`` it contributes C · v_u / (‖v_u‖ + γ) instead (automatic clipping, Bu et al. 2023,
    "Automatic clipping: differentially private deep learning made easier and stronger"; normalised SGD, Yang et
    al. 2022), of norm C‖v_u‖/(‖v_u‖ + γ) < C: the same sensitivity C.

    Raises:
        ValueError: P < 1, C ≤ 0, or γ ≤ 0 / non-finite.
    """

    def __init__(
        self,
        num_params: int,
        max_grad_norm: float,
        device: torch.device | str,
        *,
        keep_norms: bool = True,
        normalize_gamma: float | None = None,
    ):
        if num_params < 1 or not max_grad_norm > 0:
            raise ValueError(f"num_params={num_params}, max_grad_norm={max_grad_norm}: expected P >= 1 and C > 0")
        if normalize_gamma is not None and not (0 < normalize_gamma < float("inf")):
            raise ValueError(f"normalize_gamma={normalize_gamma}: expected a finite γ > 0")
        self.normalize_gamma = None if normalize_gamma is None else float(normalize_gamma)
        self.P, self.max_grad_norm, self.device, self.keep_norms = num_params, float(max_grad_norm), device, keep_norms
        self._sum = torch.zeros(num_params, dtype=torch.float32, device=device)
        self._open: torch.Tensor | None = None  # allocated on the first unit that spans two physical batches
        self.begin_step()

    def begin_step(self) -> None:
        """Start a logical step: zero the clipped sum, no open unit, no units seen."""
        self._sum.zero_()
        self._open_id: int | None = None
        self._last_id: int | None = None
        self._norms: list[torch.Tensor] = []
        self.units = 0
        self.zeroed = torch.zeros((), dtype=torch.int64, device=self.device)  # records zeroed this step (private)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The tensors held between calls (for tests of the memory bound): the sum, the open row if allocated."""
        state = {"clipped_sum": self._sum}
        if self._open is not None:
            state["open_row"] = self._open
        return state

    def add(
        self,
        G: torch.Tensor,
        unit_ids: torch.Tensor,
        *,
        last_unit_continues: bool = False,
        row_weight: torch.Tensor | None = None,
        finite_rows: torch.Tensor | None = None,
    ) -> None:
        """Fold one physical batch into the step.

        A record whose gradient row holds a non-finite value (an overflow), or whose loss was non-finite
        (``finite_rows`` False), contributes ZERO: its row is replaced by zeros after it is formed (a NaN times a
        zero weight would still be NaN) and its unit is still counted, clipped and summed as usual, so the step's
        sensitivity stays C and the noise and the accountant step are untouched. How many rows were
        zeroed is a count of the private data: :attr:`zeroed` (a device tensor, read once per logical step by the
        loop) goes to the private diagnostics only.

        Args:
            G: (B, P) fp32, row i = record i's gradient. Scaled in place by ``row_weight`` when given.
            unit_ids: (B,) integer unit ids (any local numbering), non-decreasing; a unit's records contiguous
                across the whole step. A batch may start with the unit left open by the previous batch.
            last_unit_continues: the batch's last unit has more records in the next physical batch: its rows are
                summed into the open row and clipped when its last record arrives.
            row_weight: (B,) weight w_i of each record in its unit's vector (unit_clipping=mean: 1/records), or None.
            finite_rows: (B,) bool, False for a record whose loss was non-finite (its row is zeroed), or None.

        Raises:
            ValueError: shapes, decreasing ids, a unit that reappears after it was closed, or an open unit that the
                batch does not continue.
        """
        if G.dim() != 2 or G.shape[1] != self.P or unit_ids.shape != (G.shape[0],) or G.shape[0] == 0:
            raise ValueError(f"G {tuple(G.shape)} and unit_ids {tuple(unit_ids.shape)}: expected (B, {self.P}), (B,)")
        ids = unit_ids.detach().to("cpu", torch.long)
        if bool((ids[1:] < ids[:-1]).any()):
            raise ValueError("unit_ids must be non-decreasing: a unit's records are contiguous")
        first = int(ids[0])
        if self._open_id is not None and first != self._open_id:
            raise ValueError(f"unit {self._open_id} was left open but the next batch starts with unit {first}")
        if self._open_id is None and self._last_id is not None and first <= self._last_id:
            raise ValueError(f"unit {first} comes after unit {self._last_id} was closed: units must be contiguous")
        # (B,): an overflow anywhere in the record's row. A row sum is finite iff every entry is (a NaN or ±inf makes
        # it NaN/inf; finite entries whose sum overflows fp32 are flagged too): B floats, never a (B, P) mask.
        bad = ~torch.isfinite(G.sum(dim=1))
        if finite_rows is not None:
            bad |= ~finite_rows.to(G.device, torch.bool)
        G.masked_fill_(bad.unsqueeze(1), 0.0)  # zero contribution, formed row replaced (no host sync)
        self.zeroed += bad.sum()
        if row_weight is not None:
            G.mul_(row_weight.to(G.device, G.dtype).unsqueeze(1))
        uniq, counts = torch.unique_consecutive(ids, return_counts=True)
        merged_open = self._open_id is not None
        if not merged_open and not last_unit_continues and len(uniq) == len(ids):
            norms = G.norm(dim=1)  # row level: every unit is one record, no per-unit buffer
            factor = self._factor(norms)
            self._sum.addmv_(G.t(), factor)
            self._record(norms)
        else:
            self._add_grouped(G, counts, merged_open, last_unit_continues)
        self._open_id = int(uniq[-1]) if last_unit_continues else None
        self._last_id = int(uniq[-1])

    def _add_grouped(self, G: torch.Tensor, counts: torch.Tensor, merged_open: bool, continues: bool) -> None:
        """Units with several rows, or touching the open row: sum them into at most B/2 + 2 rows, clip, add.

        Every index is built on the host from ``counts`` (host data: the sampler's unit ids) and crosses to G's
        device as ONE packed tensor; on the device only index_add/index_copy/index_select and slices run, so the
        path has no boolean-mask indexing (a device sync each on CUDA) and no per-index small copies, which
        dominate a step of a small, launch-bound model.
        """
        n, B = len(counts), G.shape[0]
        seg = torch.repeat_interleave(torch.arange(n, device="cpu"), counts)  # (B,) segment of each row (host)
        special = counts > 1
        if merged_open:
            special[0] = True
        if continues:
            special[-1] = True
        special_seg = special.nonzero().flatten()  # (m,) segments summed into S, in order (host)
        m = len(special_seg)
        slot_of_seg = torch.full((n,), m, dtype=torch.long, device="cpu")  # m: S's sink row, for single-record units
        slot_of_seg[special_seg] = torch.arange(m, device="cpu")
        single = ~special[seg]
        has_single = bool(single.any())
        # row_seg: a single-record row's segment, else n (a sink entry of norms and factors, dropped)
        row_seg = torch.where(single, seg, n)
        packed = torch.cat([slot_of_seg[seg], row_seg, special_seg]).to(G.device, non_blocking=True)
        row_slot, row_seg, special_seg = packed.split([B, B, m])
        norms = torch.zeros(n + 1, dtype=torch.float32, device=G.device)
        if has_single:
            # each single-record segment receives exactly one row; the sink sums the others and is dropped
            norms.index_add_(0, row_seg, G.norm(dim=1))
        if m:
            S = torch.zeros((m + 1, self.P), dtype=torch.float32, device=G.device)  # last row: a sink for singles
            S.index_add_(0, row_slot, G)
            S = S[:m]
            if merged_open:
                S[0].add_(self._open)
            # A unit whose finite rows sum past the fp32 range contributes zero too (its clip factor would be 0 and
            # 0·inf is NaN: one unit would poison the step). A unit still open keeps its overflowed sum zeroed.
            overflow = ~torch.isfinite(S.sum(dim=1))
            S.masked_fill_(overflow.unsqueeze(1), 0.0)
            self.zeroed += overflow.sum()
            norms.index_copy_(0, special_seg, S.norm(dim=1))
        complete = n - 1 if continues else n  # the open unit is clipped when its last record arrives
        factors = self._factor(norms)
        factors[complete:] = 0.0  # the sink, and the open unit (a slice: no sync)
        if has_single:
            self._sum.addmv_(G.t(), factors.index_select(0, row_seg))
        if m:
            self._sum.addmv_(S.t(), factors.index_select(0, special_seg))
            if continues:
                if self._open is None:
                    self._open = torch.empty(self.P, dtype=torch.float32, device=G.device)
                self._open.copy_(S[-1])
        self._record(norms[:complete])

    def _factor(self, norms: torch.Tensor) -> torch.Tensor:
        """Scale of each unit's vector: min(1, C/(‖v‖ + 1e-6)) (clip) or C/(‖v‖ + γ) (normalize)."""
        if self.normalize_gamma is not None:
            factor = self.max_grad_norm / (norms + self.normalize_gamma)
        else:
            factor = (self.max_grad_norm / (norms + EPS)).clamp(max=1.0)
        # A factor in fp32's subnormal range is rounded to a coarse step and may round UP by as much as 2x, so the
        # unit would contribute up to ~2C; such a unit (its norm ~1e38 times C) counts as 0, as an overflowed one.
        return factor.masked_fill(factor < torch.finfo(factor.dtype).tiny, 0.0)

    def _record(self, norms: torch.Tensor) -> None:
        self.units += len(norms)
        if self.keep_norms:
            self._norms.append(norms.detach())

    def finish(self) -> tuple[torch.Tensor, torch.Tensor]:
        """End the step: (clipped sum (P,) fp32, norms (U,) of the U complete units before clipping, or (0,)).

        The returned sum is the accumulator's own storage: use it before the next :meth:`begin_step`.

        Raises:
            TrainingFailedError: a unit is still open (its last record never came).
        """
        if self._open_id is not None:
            raise TrainingFailedError(f"unit {self._open_id} was still open at the end of the logical step")
        norms = torch.cat(self._norms) if self._norms else torch.zeros(0, device=self.device)
        return self._sum, norms
