"""After a release: held-out loss and perplexity (`heldout`) and generated replies (`generate`).

May import: the stages below it (contract … release, ledger) and `dplora.errors`.
"""
