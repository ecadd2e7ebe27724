"""The data stage: records from files (`readers`), protected units, Poisson sampling of units and tokens (`units`),
the demo and TWCS data sets (`demo`, `twcs`) and declared-public samples (`public`).

May import: `dplora.errors`, `dplora.signals`, `dplora.accounting`, `dplora.contract`, `dplora.plan`.
"""
