"""After a release: held-out loss and perplexity (`heldout`), its per-group numbers and report lines (`report`) and
generated replies (`generate`).

May import: the stages below it (contract … release, ledger) and `dplora.errors`.
"""
