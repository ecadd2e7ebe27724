from __future__ import annotations

import copy
import dataclasses
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model
from support.issue44_attacks import contract_raw
from tiny import save_tiny_model, tiny_llama

from dplora.accounting import epsilon
from dplora.accounting import registry as acc_registry
from dplora.accounting.events import DpSgdEvent
from dplora.contract.choices import PerSamplePath
from dplora.contract.loader import parse_contract
from dplora.engine import batch as batching
from dplora.engine import distributed
from dplora.errors import BadInputError
from dplora.mechanism import control, sampling
from dplora.mechanism import optimizer as dpopt
from dplora.mechanism.core import DPMechanism, NonPrivateEvent, PerformanceFlags, make_mechanism
from dplora.recipe.config import RunOptions, compile_run

# ruff: noqa: E501 - planted one-line sources
"""Red team of the issue-44 restructure (dplora/mechanism/, RunOptions, accountant registry).

Each test is one attack on the stated guarantee after the move; a passing test guards what held, an
``xfail(strict=True)`` records a finding (the reason says what broke). Brute-force references throughout.
"""


ROOT = Path(__file__).resolve().parents[2]


sys.path.insert(0, str(ROOT / "tests"))


sys.path.insert(0, str(ROOT / "scripts"))


pytestmark = pytest.mark.filterwarnings(
    "ignore:Full backward hook is firing:UserWarning", "ignore::FutureWarning", "ignore::DeprecationWarning"
)


PAD = 256


IGNORE = batching.IGNORE_INDEX


RECORDS = [
    ([1, 2, 3, 4, 5], [IGNORE, IGNORE, 3, 4, 5]),
    ([6, 7, 8], [6, 7, 8]),
    ([9, 10, 11, 12, 13, 14, 15], [9, 10, 11, 12, 13, 14, 15]),
    ([20, 21], [20, 21]),
    ([40, 41, 42, 43], [40, 41, 42, 43]),
    ([50, 51, 52, 53, 54, 55], [IGNORE, 51, 52, 53, 54, 55]),
]


GROUPS = [[0, 1, 2], [3], [4, 5]]  # three units: 3, 1 and 2 records


def _lora(seed=0):
    model = tiny_llama(seed=seed)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    )
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    peft_model.train()
    return peft_model


def _plan(*, sigma=1.0, clip=1.0, batch=4.0, q=0.5, steps=10, clipping="clip"):
    return SimpleNamespace(
        noise_multiplier=sigma, max_grad_norm=clip, expected_batch_size=batch, sample_rate=q, steps=steps,
        adjacency="add_remove", clipping=clipping,
    )  # fmt: skip


def _wrap(model, plan, *, per_sample="fast", unit_mean=False, private=True):
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.SGD([p for _, p in named], lr=0.0)
    flags = PerformanceFlags(per_sample=PerSamplePath(per_sample))
    if private and plan.noise_multiplier == 0:  # σ = 0 only to read the clipped sum exactly: make_mechanism refuses
        # a private mechanism without noise, so build the frozen object directly (a test-only mechanism)
        event = DpSgdEvent(sample_rate=plan.sample_rate, noise_multiplier=0.0, steps=plan.steps)
        mech = DPMechanism(
            private=True, event=event, plan=plan, unit_mean=unit_mean, flags=flags, world=distributed.SINGLE
        )
    else:
        mech = make_mechanism(plan, flags, distributed.SINGLE, private=private, unit_mean=unit_mean)
    gsm, step_opt, acc = mech.wrap(model, opt)
    return mech, gsm, step_opt, acc, named


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
def test_empty_steps_draw_once_with_std_sigma_c_and_step_the_accountant(per_sample):
    """K empty steps through DPMechanism.wrap: K draws (nonces), K accountant steps, grad·E ~ N(0, (σC)²)."""
    sigma, clip, E, K = 1.7, 0.6, 5.0, 24
    _, _, dp_opt, acc, named = _wrap(_lora(), _plan(sigma=sigma, clip=clip, batch=E), per_sample=per_sample)
    draws0 = dp_opt.generator.draws
    values = []
    for _ in range(K):
        dp_opt.begin_logical_step(0)
        dp_opt.step()
        values.append(torch.cat([p.grad.detach().flatten() for p in dp_opt.params]) * E)
        dp_opt.zero_grad(set_to_none=True)
    assert dp_opt.generator.draws - draws0 == K
    assert acc.steps == K and acc.history == [(sigma, 0.5, K)]
    x = torch.stack(values).double()
    n = x.numel()  # P·K values, P = 2 layers · 2 modules · (4·16 + 16·4) = 512
    assert n == 512 * K
    std = float(x.std())
    # sample std of n normals: relative s.e. 1/sqrt(2n) ≈ 0.0064; 6 s.e. bound
    assert abs(std / (sigma * clip) - 1) < 6 / math.sqrt(2 * n), std
    assert abs(float(x.mean())) < 6 * sigma * clip / math.sqrt(n)
    # successive steps are not the same draw (distinct nonces)
    assert not torch.equal(values[0], values[1])


def test_two_mechanisms_get_two_noise_keys():
    """A fresh wrap (as on resume) draws a fresh 256-bit key: the first draws of two engines differ."""
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        np.random.seed(0)
        _, _, dp_opt, _, _ = _wrap(_lora(), _plan())
        dp_opt.begin_logical_step(0)
        dp_opt.step()
        outs.append(torch.cat([p.grad.flatten() for p in dp_opt.params]).clone())
    assert not torch.equal(outs[0], outs[1])
    assert float((outs[0] - outs[1]).abs().max()) > 0.1


def test_sigma_zero_private_plan_is_refused_by_make_mechanism():
    """make_mechanism's docstring: 'Raises ValueError: the plan's q, σ or T cannot make a DP-SGD event'."""
    with pytest.raises(ValueError):
        make_mechanism(_plan(sigma=0.0), PerformanceFlags(), distributed.SINGLE, private=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.parametrize("enabled", [True, False])
def test_the_compiled_mechanism_follows_privacy_enabled(tmp_path, model_dir, enabled):
    contract = parse_contract(contract_raw(tmp_path, model_dir, privacy={"enabled": enabled}))
    plan = _plan(sigma=1.3)
    if not enabled:
        import math as _m

        from dplora.plan.training import TrainingPlan, control_plan

        fields = {f.name: None for f in dataclasses.fields(TrainingPlan)}
        plan = TrainingPlan(**{**fields, "noise_multiplier": 1.3, "sample_rate": 0.25, "steps": 3,
                               "expected_batch_size": 2.0, "epsilon_curve": ((3, 1.0),), "epsilon": 1.0,
                               "target_epsilon": 2.0})  # fmt: skip
        assert _m.isinf(control_plan(plan).epsilon)
    mech = compile_run(contract, plan, RunOptions(), distributed.SINGLE).mechanism()
    assert mech.private is enabled
    if enabled:
        assert isinstance(mech.event, DpSgdEvent) and mech.event.noise_multiplier == 1.3
        _, _, step_opt, acc, _ = _wrap(_lora(), plan)
        assert isinstance(step_opt, dpopt.UnitDPOptimizer) and isinstance(acc, dpopt.StepAccountant)
    else:
        assert isinstance(mech.event, NonPrivateEvent) and mech.plan.noise_multiplier == 0.0
        assert math.isinf(mech.plan.epsilon) and mech.reducer(10, "cpu") is None
        model = _lora()
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)
        _, step_opt, counter = mech.wrap(model, opt)
        assert isinstance(step_opt, control.NonPrivateStep) and isinstance(counter, control.StepCounter)


def test_sampler_is_poisson_from_fresh_entropy(monkeypatch):
    """DPMechanism.sampler: PoissonUnitSampler, default_rng() with no seed, per-unit inclusion ≈ q."""
    calls = []
    real = np.random.default_rng

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(sampling.np.random, "default_rng", spy)
    mech = make_mechanism(_plan(q=0.3), PerformanceFlags(), distributed.SINGLE)
    np.random.seed(7)
    torch.manual_seed(7)
    s1, s2 = mech.sampler(2000), mech.sampler(2000)
    assert isinstance(s1, sampling.PoissonUnitSampler)
    assert calls == [((), {}), ((), {})]  # never seeded
    a, b = s1.sample(), s2.sample()
    assert not np.array_equal(a, b)
    counts = np.zeros(2000)
    for _ in range(50):
        counts[s1.sample()] += 1
    # 100000 Bernoulli(0.3) trials: mean 0.3, s.e. 0.00145
    assert abs(counts.mean() / 50 - 0.3) < 0.01
    # batch sizes vary (Poisson, not fixed size)
    sizes = {len(s1.sample()) for _ in range(20)}
    assert len(sizes) > 3


def test_sharded_sampler_union_is_poisson_over_all_units():
    """W = 2: each rank samples only its shard (u mod W == rank); union over ranks covers all N at rate q."""
    mech_worlds = [dataclasses.replace(distributed.SINGLE, rank=r, world_size=2) for r in (0, 1)]
    hits = np.zeros(101)
    for w in mech_worlds:
        assert w.distributed
        s = make_mechanism(_plan(q=0.4), PerformanceFlags(), w).sampler(101)
        assert isinstance(s, sampling.ShardedPoissonSampler)
        for _ in range(200):
            u = s.sample()
            assert np.all(u % 2 == w.rank)
            hits[u] += 1
    assert abs(hits.mean() / 200 - 0.4) < 0.03 and hits.min() > 0


def test_empty_poisson_batches_occur():
    s = make_mechanism(_plan(q=0.001), PerformanceFlags(), distributed.SINGLE).sampler(10)
    assert sum(len(s.sample()) == 0 for _ in range(200)) > 150


def _brute(model, records):
    ref = copy.deepcopy(model)
    out = []
    for ex in records:
        ref.zero_grad(set_to_none=True)
        batching.per_sequence_loss(ref, batching.collate([ex], PAD)).sum().backward()
        out.append(torch.cat([p.grad.flatten() for n, p in ref.named_parameters() if p.requires_grad]).clone())
    return out


@pytest.mark.parametrize("per_sample", ["fast", "opacus"])
@pytest.mark.parametrize("mode", ["sum", "mean", "normalize"])
def test_per_unit_clip_before_sum_through_mechanism(per_sample, mode):
    """σ = 0 so the noise is exactly zero: grad·E equals Σ_units clip(Σ_records g) (not Σ clip(g))."""
    clip = 0.05
    model = _lora()
    per_record = _brute(model, RECORDS)
    plan = _plan(sigma=0.0, clip=clip, batch=3.0, clipping="normalize" if mode == "normalize" else "clip")
    _, gsm, dp_opt, _, _ = _wrap(model, plan, per_sample=per_sample, unit_mean=mode == "mean")
    units = [u for u, g in enumerate(GROUPS) for _ in g]
    records = [RECORDS[r] for g in GROUPS for r in g]
    dp_opt.begin_logical_step(len(GROUPS))
    for start in (0, 4):  # physical batches of 4: unit 2 spans both
        end = min(start + 4, len(records))
        batch = batching.collate(records[start:end], PAD)
        dp_opt.prepare_batch(end - start)
        batching.per_sequence_loss(gsm, batch).sum().backward()
        counts = {u: units.count(u) for u in units}
        dp_opt.accumulate(
            torch.tensor(units[start:end]),
            continues=end < len(units) and units[end] == units[end - 1],
            row_weight=torch.tensor([1.0 / counts[u] for u in units[start:end]]),
        )
    dp_opt.step()
    got = torch.cat([p.grad.flatten() for p in dp_opt.params]) * 3.0
    from dplora.contract.spec import NORMALIZE_GAMMA

    want = torch.zeros_like(per_record[0])
    naive = torch.zeros_like(per_record[0])
    for g in GROUPS:
        s = sum(per_record[r] for r in g)
        if mode == "mean":
            s = s / len(g)
        norm = float(s.norm())
        assert norm > clip  # every unit is clipped: the test can tell the orders apart
        want += s * (clip / (norm + NORMALIZE_GAMMA * clip) if mode == "normalize" else min(1.0, clip / norm))
        for r in g:
            naive += per_record[r] * min(1.0, clip / float(per_record[r].norm()))
    assert torch.allclose(got, want, atol=1e-6, rtol=1e-4), float((got - want).abs().max())
    assert not torch.allclose(got, naive, atol=1e-4)
    assert float(got.norm()) <= len(GROUPS) * clip + 1e-6  # each unit contributes at most C


def test_performance_flags_only_choose_how_the_rows_are_computed():
    """Every PerformanceFlags field (per-example path, physical batch, checkpointing, sharding, threads, dtype,
    attention, checkpoint interval) changes nothing of the event, plan or unit_mean."""
    from dplora.contract.choices import AttnImplementation, Precision, Sharding

    plan = _plan()
    base = make_mechanism(plan, PerformanceFlags(), distributed.SINGLE)
    others = {
        "per_sample": PerSamplePath.OPACUS,
        "physical_batch_size": "auto",
        "gradient_checkpointing": True,
        "sharding": Sharding.FSDP,
        "threads": 3,
        "dtype": Precision.BF16,
        "attn_implementation": AttnImplementation.EAGER,
        "checkpoint_every": 5,
    }
    assert set(others) == {f.name for f in dataclasses.fields(PerformanceFlags)}  # a new flag is added here too
    for name, value in others.items():
        m = make_mechanism(plan, PerformanceFlags(**{name: value}), distributed.SINGLE)
        assert m.event == base.event and m.plan is base.plan and m.private and m.unit_mean == base.unit_mean, name


PLANTS_CAUGHT = {
    # found since the red team's round (issue 44): resolved aliases, torch's in-place and *_like draws, reduce, all_gather
    "torch.randn_like * sigma": "import torch\ndef f(g, s):\n    return g + torch.randn_like(g) * s\n",
    "tensor.normal_": "import torch\ndef f(g, s):\n    return g + torch.empty_like(g).normal_(0, s)\n",
    "aliased torch.normal": "import torch as th\ndef f(g, s):\n    return g + th.normal(0.0, s, g.shape)\n",
    "dist.reduce": "import torch.distributed as dist\ndef f(t):\n    dist.reduce(t, dst=0)\n",
    "all_gather + sum": "import torch, torch.distributed as dist\ndef f(t, w):\n    out = [torch.empty_like(t) for _ in range(w)]\n    dist.all_gather(out, t)\n    return sum(out)\n",
    "aliased all_reduce": "from torch.distributed import all_reduce as ar\ndef f(t):\n    ar(t)\n",
    "opacus clipper": "from opacus.optimizers import DPOptimizer\ndef f(o):\n    return DPOptimizer(o, noise_multiplier=1.0, max_grad_norm=1.0, expected_batch_size=4)\n",
    "torch.normal": "import torch\ndef f(g, s):\n    return g + torch.normal(0.0, s, g.shape)\n",
    "dist.all_reduce": "import torch.distributed as dist\ndef f(t):\n    dist.all_reduce(t)\n",
    "from-import all_reduce": "from torch.distributed import all_reduce\ndef f(t):\n    all_reduce(t)\n",
    "np binomial": "import numpy as np\ndef f(n, q):\n    return np.random.binomial(1, q, n)\n",
    "torch.bernoulli": "import torch\ndef f(p):\n    return torch.bernoulli(p)\n",
}


PLANTS_MISSED = {
    # left to review, by decision: torch.randn is an initialiser (LoRA, perturbations) and stays allowed; a uniform
    # compared with q, getattr and functools.partial are not calls the rule can name without false alarms
    "torch.randn(shape) * sigma": "import torch\ndef f(g, s):\n    return g + s * torch.randn(g.shape)\n",
    "np uniform < q (Poisson)": "import numpy as np\ndef f(n, q):\n    return np.random.default_rng().random(n) < q\n",
    "getattr all_reduce": "import torch.distributed as dist\ndef f(t):\n    getattr(dist, 'all_reduce')(t)\n",
    "functools.partial all_reduce": "import functools, torch.distributed as dist\ndef f(t):\n    functools.partial(dist.all_reduce)(t)\n",
}


def _plant(tmp_path, source):
    from test_import_order import forbidden_calls

    pkg = tmp_path / "dplora"
    (pkg / "run").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "run" / "__init__.py").write_text("")
    (pkg / "run" / "planted.py").write_text(source)
    return forbidden_calls(pkg)


@pytest.mark.parametrize("name", sorted(PLANTS_CAUGHT))
def test_import_rule_catches(tmp_path, name):
    assert _plant(tmp_path, PLANTS_CAUGHT[name]), name


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=pytest.mark.xfail(
                strict=True, reason=f"known limit (docs/architecture.md): FORBIDDEN_CALLS misses {n!r}"
            ),
        )
        for n in sorted(PLANTS_MISSED)
    ],
)
def test_import_rule_misses(tmp_path, name):
    assert _plant(tmp_path, PLANTS_MISSED[name]), name


PUBLISHED = [  # (q, σ, T, δ, accountant, ε) from NOTES.md / the package docstring
    (0.01, 1.0, 300, 1e-5, "rdp", 1.451),
    (0.01, 1.0, 600, 1e-5, "rdp", 1.748),
    (0.01, 1.0, 300, 1e-5, "prv", 1.078),
    (0.01, 1.0, 600, 1e-5, "prv", 1.449),
]


@pytest.mark.parametrize("q,sigma,T,delta,acc,eps", PUBLISHED)
def test_accountants_give_published_numbers(q, sigma, T, delta, acc, eps):
    got = epsilon(sample_rate=q, noise_multiplier=sigma, steps=T, delta=delta, accountant=acc)
    assert round(got, 3) == pytest.approx(eps, abs=0.0015)


@pytest.mark.parametrize("name", ["gdp", "RDP", "prv ", "", "opacus", None])
def test_unknown_accountant_name_raises(name):
    with pytest.raises((BadInputError, ValueError, KeyError)):
        epsilon(sample_rate=0.01, noise_multiplier=1.0, steps=10, delta=1e-5, accountant=name)
    with pytest.raises((BadInputError, ValueError, KeyError)):
        acc_registry.get(name)


@pytest.mark.parametrize("name", ["gdp", "RDP", "opacus"])
def test_unknown_accountant_in_contract_is_bad_input(tmp_path, model_dir, name):
    with pytest.raises(BadInputError):
        parse_contract(contract_raw(tmp_path, model_dir, privacy={"accountant": name}))


def test_every_run_option_is_read():
    """Each RunOptions field is read by the code (an unread field is an option silently dropped)."""
    import ast

    fields = {f.name for f in dataclasses.fields(RunOptions)}
    read = set()
    for path in (ROOT / "dplora").rglob("*.py"):
        if path.name == "options.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in fields:
                owner = node.value
                if (isinstance(owner, ast.Name) and owner.id in {"options", "run_options", "opts"}) or (
                    isinstance(owner, ast.Attribute) and owner.attr == "options"
                ):
                    read.add(node.attr)
    assert fields - read == set()


def test_cli_train_passes_every_option(monkeypatch, tmp_path):
    """`dplora train` builds RunOptions from every flag (tuning_trial, non_private, ledger, resume...)."""
    import inspect

    from dplora.cli import train as cli_train

    src = inspect.getsource(cli_train)
    for name in ("signing_key", "data_key", "ledger_path", "overwrite", "resume", "threads", "progress",
                 "tuning_trial", "non_private", "contract_path"):  # fmt: skip
        assert f"{name}=" in src, name


def test_tuning_trial_no_ledger_release_and_canaries_are_charged(tmp_path, model_dir, monkeypatch):
    """A sweep-like run (tuning_trial, ledger_release=False) with extra_records: charged as tuning, settled at
    ε spent, no release row; the extra rows are units in the plan (N = rows + 2)."""
    from dplora.ledger.store import Ledger
    from dplora.recipe.train import run_training
    from dplora.release import envelope
    from dplora.release import keys as release_keys

    monkeypatch.delenv(envelope.DATA_KEY_ENV, raising=False)
    key = release_keys.generate_keypair(tmp_path / "k" / "s.pem")[0]
    from dplora.recipe import train as train_mod

    raw = contract_raw(tmp_path, model_dir, rows=8, privacy={"num_units": 10})  # public N: 8 rows + 2 canaries
    contract = parse_contract(raw)
    db = tmp_path / "ledger.db"
    extra = ({"text": "canary one 424242"}, {"text": "canary two 737373"})
    seen = []
    real_index = train_mod.data_mod.build_unit_index

    def index_spy(table, *args, **kwargs):
        seen.append([row["text"] for row in table])
        return real_index(table, *args, **kwargs)

    monkeypatch.setattr(train_mod.data_mod, "build_unit_index", index_spy)
    result = run_training(
        contract,
        RunOptions(
            signing_key=key,
            progress=False,
            threads=1,
            ledger_path=db,
            tuning_trial=True,
            ledger_release=False,
            extra_records=extra,
        ),
        log=lambda *_: None,
    )
    assert len(seen) == 1 and len(seen[0]) == 10 and seen[0][-2:] == [e["text"] for e in extra]
    ledger = Ledger(db, create=False)
    charges = ledger.unassigned()
    assert len(charges) == 1
    c = charges[0].to_dict()
    assert c["purpose"] == "tuning" and c["run_id"] == result.run_id
    assert float(c["epsilon"]) == pytest.approx(result.plan.epsilon)
    assert ledger.releases(result.run_id) == []


COMPOSE_MAIN = Path("/tmp/attack44/compose_main.json")


COMPOSE_I44 = Path("/tmp/attack44/compose_i44.json")


@pytest.mark.skipif(
    not (COMPOSE_MAIN.is_file() and COMPOSE_I44.is_file()), reason="run /tmp/attack44/compose_grid.py first"
)
def test_trial_composition_identical_to_main():
    """dplora.accounting.composition.compose (tuning trials) gives main's compositions, key for key."""
    main, new = json.loads(COMPOSE_MAIN.read_text()), json.loads(COMPOSE_I44.read_text())
    assert len(main) == 10 and main == new
