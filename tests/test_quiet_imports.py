"""Third-party import-time notices that are not actionable do not reach dplora's users; the rest still do."""

import logging

import dplora  # noqa: F401  (installs the filter)


def test_the_bitsandbytes_cpu_kernel_notice_is_dropped_and_its_other_warnings_kept(caplog):
    log = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING):
        log.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
            "`pip install kernels` and the kernels >= 0.11.1",
            "No module named 'kernels'",
        )
        log.warning("some other bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["some other bitsandbytes warning"]


def test_library_notices_that_are_not_actionable_are_dropped_and_others_kept(caplog):
    """bitsandbytes' CPU kernel notice and the `kernels` package's offline trust-check line are filtered (each would
    add a line under every one-line refusal); other warnings of the same loggers still show."""
    import logging

    assert dplora.__version__  # importing dplora installed the filters

    with caplog.at_level(logging.WARNING):
        hub = logging.getLogger("kernels._internals.hf_hub")
        hub.warning("Skipping publisher trust check for 'kernels-community/x' because Hugging Face Hub is offline.")
        hub.warning("another kernels warning")
        bnb = logging.getLogger("bitsandbytes.backends.cpu.ops")
        bnb.warning("Failed to load CPU gemm_4bit_forward from kernels-community")
        bnb.warning("another bitsandbytes warning")
    assert [r.getMessage() for r in caplog.records] == ["another kernels warning", "another bitsandbytes warning"]
