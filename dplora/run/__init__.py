"""The run stage: the run's frozen spec, mutable state and loop (`loop`), output folders (`outputs`), resume
checkpoints (`checkpoint`), what `--resume` checks (`resume`) and progress (`progress`).

May import: the stages below it (contract, accounting, plan, data, engine) and `dplora.errors`, `dplora.signals`.
"""
