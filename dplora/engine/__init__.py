"""The engine stage: model loading and precision (`model`), the per-example gradient paths (`fastclip`, Opacus in
`step`), per-unit clipping and noise (`clipping`, `noise`), the distributed reduction (`distributed`), the
gradient check before step 1 (`gradcheck`) and the non-private control's step (`control`). The only place that
touches per-example gradients.

May import: the stages below it (contract, accounting, plan, data) and `dplora.errors`, `dplora.signals`.
"""
