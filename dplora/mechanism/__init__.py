"""The DP mechanism, in one package so it can be audited in one place: the only code that samples, clips, draws
noise or reduces across ranks.

- :mod:`~dplora.mechanism.sampling`: Poisson sampling over protected units, and its sharded form;
- :mod:`~dplora.mechanism.clipping`: per-unit accumulation of per-example rows, clip or normalize to C;
- :mod:`~dplora.mechanism.noise`: the CSPRNG Gaussian (ChaCha20 keyed from ``os.urandom``) and the noisy mean;
- :mod:`~dplora.mechanism.reduction`: the one cross-rank reduction of clipped sums per logical step;
- :mod:`~dplora.mechanism.optimizer`: the DP optimizer over units and the step accountant;
- :mod:`~dplora.mechanism.control`: the non-private control (same steps, no clipping or noise).

Stage: above ``engine`` (the model side that produces per-example rows), below ``run`` (the step loop).
``tests/test_import_order.py`` fails on a noise draw, sampler or ``all_reduce`` written outside this package.
"""
