"""The plan stage: q, T, σ and the accountant for a contract (`training`: the frozen `TrainingPlan`).

May import: `dplora.errors`, `dplora.accounting`, `dplora.contract`. No torch, no data, no model.
"""
