"""Hub model ids from the local cache (issue 32.3): ``model.name: ORG/NAME`` resolves from a Hugging Face cache
folder built here (``models--org--name/snapshots/<commit>/`` + ``refs/main``), trains, and the record and card name
the id and the commit; a model not in the cache is a one-line exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import contract_dict
from support.hub_model import COMMIT, OTHER, build_hub_cache
from support.hub_train import train_hub_id

from dplora.contract.loader import parse_contract
from dplora.errors import BadInputError

pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning")


@pytest.fixture
def hub_cache(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    return build_hub_cache(tmp_path, tiny_model_dir, monkeypatch)


def _model_section(**model):
    raw = contract_dict(Path("m"), Path("d.csv"), Path("o"), privacy={"num_units": 100})
    raw["model"] = model
    return parse_contract(raw).model


def test_hub_id_resolves_to_the_cached_snapshot_of_its_revision(hub_cache):
    from dplora.engine.basefiles import base_model_entry
    from dplora.engine.model import resolve_model

    folder, gguf = resolve_model(_model_section(name="tiny-org/tiny-llama"))
    assert gguf is None and folder == hub_cache / "models--tiny-org--tiny-llama" / "snapshots" / COMMIT
    folder, _ = resolve_model(_model_section(name="tiny-org/tiny-llama", revision="v1"))
    assert folder.name == OTHER
    entry = base_model_entry(_model_section(name="tiny-org/tiny-llama", revision="v1"))
    assert entry["name_or_path"] == "tiny-org/tiny-llama" and entry["name_source"] == "hub id"
    assert entry["revision"] == "v1" and entry["commit"] == OTHER and entry["resolvable"] is True
    assert "model.safetensors" in entry["files"] and "config.json" in entry["files"]


@pytest.mark.parametrize(
    ("model", "needle"),
    [
        ({"name": "tiny-org/absent"}, "model.name=tiny-org/absent is not in the local Hugging Face cache"),
        ({"name": "tiny-org/tiny-llama", "revision": "v2"}, "tiny-org/tiny-llama at revision v2 is not in the"),
    ],
)
def test_a_model_not_in_the_cache_is_a_clear_bad_input(hub_cache, model, needle):
    from dplora.engine.model import resolve_model

    with pytest.raises(BadInputError, match=needle):
        resolve_model(_model_section(**model))


@pytest.mark.parametrize(
    "model",
    [
        {"name": "not a hub id"},
        {"name": "a--b/c"},
        {"name": "smollm2-135m", "revision": "main"},
        {"path": "/m", "revision": "x"},
    ],
)
def test_contract_refuses_non_hub_names_and_a_revision_without_a_hub_id(model):
    with pytest.raises(BadInputError):
        _model_section(**model)


def test_train_from_a_hub_id_not_cached_exits_2_in_one_line(tmp_path, hub_cache, tickets_csv, signing_key):
    result = train_hub_id(tmp_path, tickets_csv, signing_key, "tiny-org/absent")
    assert result.exit_code == 2, result.output
    assert "not in the local Hugging Face cache" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run").exists()
