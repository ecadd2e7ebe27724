"""The ledger stage: the privacy ledger's store and composition (`store`), the pre-check of planned runs against a
population's cap (`plans`), settling killed runs and intermediate releases from their checkpoints (`recovery`).

May import: the stages below it (contract … run, release) and `dplora.errors`.
"""
