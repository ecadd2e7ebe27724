"""transformers' Hub kernels kept off: no layer of a run is replaced by code fetched from the Hugging Face Hub.

transformers 5.x (with the ``kernels`` package, which 5.25 requires) kernelizes a model in ``from_pretrained`` and
again in ``model.train()``: on CUDA it fetches ``kernels-community/*`` layers from the Hub. dplora turns this off
twice: the environment variable :data:`HUB_KERNELS_ENV` (set by :func:`dplora.engine.model.quiet_transformers`)
and ``use_kernels=False`` on every load (:func:`no_hub_kernels`). A leaf module so that the loaders of
:mod:`dplora.engine.model` and :mod:`dplora.engine.quantize` share it without an import cycle.
"""

from __future__ import annotations

import functools

HUB_KERNELS_ENV = "USE_HUB_KERNELS"  # transformers ``integrations.hub_kernels._kernels_enabled`` reads it per call


@functools.cache
def no_hub_kernels() -> dict:
    """``from_pretrained`` keyword arguments that keep Hub kernels off: ``{"use_kernels": False}`` where the
    installed transformers takes that argument (4.5x and later), else ``{}`` (older versions have no Hub kernels).

    Passed on every model load besides :data:`HUB_KERNELS_ENV` (:func:`dplora.engine.model.quiet_transformers`),
    so a load never kernelizes even if the environment is changed later. Source: transformers
    ``PreTrainedModel.from_pretrained`` (``use_kernels``) and ``PreTrainedModel.set_use_kernels``.

    Returns:
        The keyword arguments (a dict of at most one entry).
    Raises:
        ImportError: transformers is not installed.

    """
    import inspect

    from transformers import PreTrainedModel

    try:
        source = inspect.getsource(PreTrainedModel.from_pretrained)
    except (OSError, TypeError):  # no source shipped: the attribute is the sign of Hub kernel support
        return {"use_kernels": False} if hasattr(PreTrainedModel, "set_use_kernels") else {}
    return {"use_kernels": False} if "use_kernels" in source else {}
