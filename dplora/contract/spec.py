"""The privacy contract: a YAML file validated into a frozen :class:`Contract` (pydantic v2).

Every key is closed: unknown keys, unknown enum values, non-finite or non-positive numbers are errors that
name the key and the allowed values. ``load_contract`` also applies command-line overrides
(``training.lr=1e-3 privacy.target_epsilon=8``, as in torchtune and LLaMA-Factory).

The YAML boundary is bounded too: a contract file is at most ``MAX_CONTRACT_BYTES``, nests at most
``MAX_NESTING`` collections deep, and may not use aliases (``*name``: no expansion, so no "billion laughs"),
explicit tags (``!!timestamp``, ``!!set``, ``!!binary``...) or keys that are not plain names. Every number
has a range that the accountant and the engine can use without overflow, and messages quote at most a short
excerpt of any value (:func:`dplora.errors.excerpt`).
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Annotated, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from dplora.accounting.calibration import SIGMA_MAX, SIGMA_MIN
from dplora.accounting.events import Accountant, Adjacency, Sampler
from dplora.contract.choices import (
    AttnImplementation,
    Clipping,
    LrSchedule,
    Optimizer,
    PerSamplePath,
    Precision,
    ProtectedUnit,
    Quantization,
    ReportTo,
    Sharding,
    UnitClipping,
)
from dplora.contract.labels import MAX_CALIBRATION_CHARS, label_set_problem
from dplora.errors import excerpt

PACKAGED_MODELS = ("smollm2-135m",)
# A Hub model id ``ORG/NAME`` (huggingface_hub's ``validate_repo_id`` rules: letters, digits, ``-_.``, no ``--`` or
# ``..``, at most 96 characters), resolved from the local Hugging Face cache only (dplora.engine.model).
HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}$")
# A Hub revision: a branch or tag name, or a 40-hex commit hash.
REVISION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,127}$")


def is_hub_id(name: str) -> bool:
    """True for a Hub model id ``ORG/NAME`` (not a packaged name, no ``--`` or ``..``, not ending in ``.git``)."""
    return bool(HUB_ID_PATTERN.match(name)) and "--" not in name and ".." not in name and not name.endswith(".git")


# Strict numbers: YAML `true`, quoted "3" or 2.0 for a count are errors, not silently coerced.
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False, strict=True)]
PositiveInt = Annotated[int, Field(gt=0, strict=True)]
MAX_STEPS = 1_000_000
MAX_EPOCHS = 100_000  # training.max_epochs: far past any real budget, so a typo (1e9) is one line
NORMALIZE_GAMMA = 0.01  # γ/C for privacy.clipping: normalize (a public constant, never tuned on data)
# --- bounds of the YAML boundary and of each number (README "The contract"; tests/contract/test_fuzz_boundary.py) ---
MAX_CONTRACT_BYTES = 64 * 1024  # a contract is a few hundred bytes; a bigger file is not a contract
MAX_NESTING = 6  # collections inside collections (a contract needs 3: contract → section → list)
MAX_TARGET_EPSILON = 1e6  # far beyond any meaningful guarantee; keeps calibration and its messages finite
NOISE_MULTIPLIER_RANGE = (SIGMA_MIN, SIGMA_MAX)  # the range calibration searches; 1e-300 and 1e300 broke RDP
MAX_GRAD_NORM = 1e6  # σ·C stays finite in fp32
# C ≥ 1e-6: below it C/‖v‖ can fall into fp32's subnormal range, where the clip factor rounds up to 2x (a unit
# would move the sum by about 2C); no real LoRA clip is that small (tuning guides put C near the median norm).
MIN_GRAD_NORM = 1e-6
MAX_NUM_UNITS = 10**12
MAX_LORA_RANK = 1024
MAX_THREADS = 1024
MAX_NAME_CHARS = 256  # column names, unit keys, module names, population names
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux
# An optimizer step moves each LoRA weight by about lr (Adam's normalised update): beyond 10 no fine-tuning is
# meaningful, and a rate such as 1e39 overflows inside the first step instead of exiting 2 here.
MAX_LR = 10
# With expected_batch_size: auto, training.lr is the rate at B = 32 and the planner runs lr·sqrt(B/32) for B up to
# the top of its grid (dplora.plan.planner.BATCH_GRID, which imports this module): the scaled rate must stay ≤ MAX_LR
PLANNER_TOP_BATCH = 8192
MAX_REFERENCE_LR = MAX_LR / (PLANNER_TOP_BATCH / 32) ** 0.5


def _printable(value: str) -> str:
    if not value.isprintable():
        raise PydanticCustomError("not_printable", "must be printable text on one line (no control characters)")
    return value


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise PydanticCustomError("nul_in_path", "must not contain a NUL character")
    return value


NonEmptyStr = Annotated[str, Field(min_length=1, strict=True)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS, strict=True), AfterValidator(_printable)]


def _expand_user(value: str) -> str:
    """A leading ``~`` or ``~user`` becomes that home folder (``os.path.expanduser``), as a shell would."""
    return os.path.expanduser(value)


PathText = Annotated[
    str,
    Field(min_length=1, max_length=MAX_PATH_CHARS, strict=True),
    AfterValidator(_no_nul),
    AfterValidator(_expand_user),
]


# LLM.int8 (Dettmers et al. 2022; transformers' llm_int8_threshold = 6.0) picks the fp16 outlier columns from the
# whole batch's activations: one record decides how another record's matmul is computed.
INT8_REFUSAL = (
    "model.quantization=8bit is refused: LLM.int8 picks its outlier columns across the whole batch, so one record "
    "changes how another record's activations are computed and the per-unit sensitivity is no longer C; use 4bit"
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=False)


class PrivacySection(_Section):
    """What is protected and how much: the part of the contract that feeds the accountant."""

    protected_unit: ProtectedUnit
    unit_key: Name | None = None
    adjacency: Adjacency
    target_epsilon: Annotated[float, Field(gt=0, le=MAX_TARGET_EPSILON, allow_inf_nan=False, strict=True)]
    delta: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False, strict=True)]
    accountant: Accountant = Accountant.PRV
    num_units: Annotated[int, Field(gt=0, le=MAX_NUM_UNITS, strict=True)] | None = None
    max_grad_norm: Annotated[float, Field(ge=MIN_GRAD_NORM, le=MAX_GRAD_NORM, allow_inf_nan=False, strict=True)]
    sampling: Sampler = Sampler.POISSON
    noise_multiplier: (
        Annotated[
            float,
            Field(ge=NOISE_MULTIPLIER_RANGE[0], le=NOISE_MULTIPLIER_RANGE[1], allow_inf_nan=False, strict=True),
        ]
        | None
    ) = None
    max_records_per_unit: PositiveInt | None = None
    unit_clipping: UnitClipping = UnitClipping.SUM
    clipping: Clipping = Clipping.CLIP
    population: Name | None = None
    per_sample: PerSamplePath = PerSamplePath.FAST
    # false: the non-private control (same data, model, steps, sampling; no clipping, no noise, no DP guarantee)
    enabled: Annotated[bool, Field(strict=True)] = True

    @model_validator(mode="after")
    def _unit_key_matches_unit(self) -> PrivacySection:
        if self.protected_unit is ProtectedUnit.ROW and self.unit_key is not None:
            raise ValueError("privacy.unit_key must be empty when protected_unit is row")
        if self.protected_unit is not ProtectedUnit.ROW and not self.unit_key:
            raise ValueError(
                f"privacy.unit_key is required when protected_unit is {self.protected_unit.value}: "
                "name the column that holds the ticket or customer id"
            )
        return self


class ModelSection(_Section):
    """The base model: a packaged name, a Hub id from the local cache, a local Hugging Face folder, or a .gguf file."""

    name: Name | None = None
    path: PathText | None = None
    revision: Name | None = None  # with a Hub id only: branch, tag or commit in the local cache (default main)
    dtype: Precision = Precision.AUTO
    allow_tf32: Annotated[bool, Field(strict=True)] | None = None
    attn_implementation: AttnImplementation = AttnImplementation.AUTO
    quantization: Quantization = Quantization.NONE

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        if self.quantization is Quantization.EIGHT_BIT:
            raise ValueError(INT8_REFUSAL)
        if (self.name is None) == (self.path is None):
            raise ValueError("model: give exactly one of model.name (packaged model) or model.path (folder or .gguf)")
        if self.name is not None and self.name not in PACKAGED_MODELS and not is_hub_id(self.name):
            raise ValueError(
                f"model.name={excerpt(self.name)}: allowed values are {', '.join(PACKAGED_MODELS)} "
                "or a Hub model id ORG/NAME in the local Hugging Face cache"
            )
        if self.revision is not None and (self.name is None or self.name in PACKAGED_MODELS):
            raise ValueError("model.revision goes with a Hub model id (model.name: ORG/NAME) only")
        if self.revision is not None and not REVISION_PATTERN.match(self.revision):
            raise ValueError(f"model.revision={excerpt(self.revision)}: not a branch, tag or commit name")
        return self


# A public warm start (data.public_warm_start): AdamW without noise on a file the contract declares public, before
# the DP phase (dplora.engine.warmstart). 1e-3: half the DP default lr (2e-3), which is tuned for noisy means over
# B = 32 records; a noise-free step of 8 records needs no larger rate, and 100 such steps stay well short of an epoch
# of a few thousand public records (a warm start, not a second fine-tuning).
DEFAULT_WARM_START_LR = 1e-3
DEFAULT_WARM_START_BATCH = 8
MAX_WARM_START_BATCH = 65_536


class PublicWarmStart(_Section):
    """``data.public_warm_start``: fit the LoRA adapter without noise on a PUBLIC file before the DP phase.

    The file has the training data's columns (record format, chat template and ``training.max_seq_len`` as the
    private records); it is never the private data (the precheck refuses ``data.path`` and ``data.eval_path`` by
    their resolved paths). No ε is charged for it: it never sees the private data. Declaring private data public
    voids the guarantee."""

    path: PathText
    steps: Annotated[int, Field(gt=0, le=MAX_STEPS, strict=True)]
    batch_size: Annotated[int, Field(gt=0, le=MAX_WARM_START_BATCH, strict=True)] = DEFAULT_WARM_START_BATCH
    lr: Annotated[float, Field(gt=0, le=10, allow_inf_nan=False, strict=True)] = DEFAULT_WARM_START_LR


DEFAULT_MESSAGES_COLUMN = "messages"
# Tokens per record by default: keeps ≥ 95 % of whole support conversations through SmolLM2's template (the
# nearest-rank p95 of the shared Bitext pairs is 263 tokens, of the demo conversations 190; rounded up to a multiple
# of 64: it keeps 99 % of Bitext and all demo conversations). Measured by scripts/token_lengths.py.
DEFAULT_MAX_SEQ_LEN = 320


class DataSection(_Section):
    """Training data read through ``datasets``: csv, jsonl or parquet; a text column, prompt/response columns, or
    one conversation per record (a ``messages`` column: a list of ``{role, content}``, rendered by the model's chat
    template, :mod:`dplora.data.chat`)."""

    path: PathText
    format: Literal["auto", "csv", "jsonl", "parquet"] = "auto"
    # What one record is: auto = text if text_column, prompt_response if prompt/response columns, else messages.
    record_format: Literal["auto", "text", "prompt_response", "messages"] = "auto"
    text_column: Name | None = None
    prompt_column: Name | None = None
    response_column: Name | None = None
    messages_column: Name | None = None  # None: DEFAULT_MESSAGES_COLUMN when the records are conversations
    # TRL conversational prompt/completion: messages_column holds the prompt turns, this column the completion turns;
    # the loss covers the completion only (dplora.data.chat.ChatEncoder's first_target)
    completion_column: Name | None = None
    train_on: Literal["assistant", "all"] = "assistant"  # messages: loss on the assistant turns, or on every token
    chat_template: Literal["auto", "none"] = "auto"  # prompt/response: through the model's template (auto) or raw
    # The held-out set (dplora.evaluate.heldout): a separate file, or a split of `path` by protected unit.
    eval_path: PathText | None = None
    eval_fraction: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False, strict=True)] | None = None
    eval_public: Annotated[bool, Field(strict=True)] = False
    label_column: Name | None = None
    group_column: Name | None = None  # public labels only: evaluation reports per group (dplora.evaluate.heldout)
    # a public file the adapter is first fitted on without noise (no ε charged: never the private data)
    public_warm_start: PublicWarmStart | None = None
    # classification: the response is one label of a DECLARED set (a list here or a public file, never collected
    # from the records); evaluation ranks the labels by per-token log-likelihood (dplora.evaluate.classify), with
    # contextual calibration as the headline only where `calibration: contextual` declares it: measured on Banking77
    # it lifts the untrained base and lowered every fine-tuned adapter (docs/utility.md), so the default is `none`
    task: Literal["generation", "classification"] = "generation"
    labels: tuple[Annotated[str, Field(strict=True)], ...] | None = None
    labels_file: PathText | None = None
    calibration_input: Annotated[str, Field(min_length=1, max_length=MAX_CALIBRATION_CHARS, strict=True)] | None = None
    calibration: Literal["none", "contextual"] | None = None  # None: "none"; absent keeps older contracts' digests

    @model_validator(mode="after")
    def _task(self) -> DataSection:
        declared = {"data.labels": self.labels, "data.labels_file": self.labels_file}
        declared["data.calibration_input"] = self.calibration_input
        declared["data.calibration"] = self.calibration
        if self.task == "generation":
            given = [key for key, value in declared.items() if value is not None]
            if given:  # every such key in the one line
                raise ValueError(
                    f"{', '.join(given)} {'needs' if len(given) == 1 else 'need'} data.task: classification"
                )
            return self
        if self.kind != "prompt_response":  # the label is the response of a prompt/response pair, as trained
            raise ValueError("data.task=classification needs data.prompt_column and data.response_column (the label)")
        if (self.labels is None) == (self.labels_file is None):
            raise ValueError(
                "data.task=classification needs a declared label set: exactly one of data.labels (a list) or "
                "data.labels_file (a public file, one label per line); it is never collected from the data"
            )
        if self.labels is not None and (problem := label_set_problem(self.labels)) is not None:
            raise ValueError(f"data.labels: {problem}")
        return self

    @model_validator(mode="after")
    def _held_out(self) -> DataSection:
        if self.eval_path is not None and self.eval_fraction is not None:
            raise ValueError("data: give at most one of data.eval_path (a file) or data.eval_fraction (a split)")
        if self.eval_public and self.eval_path is None:
            raise ValueError(
                "data.eval_public=true needs data.eval_path: a split of the training data (data.eval_fraction) "
                "is private data"
            )
        if self.label_column is not None and (self.prompt_column is None or not self.has_eval_set):
            raise ValueError(
                "data.label_column needs data.prompt_column and a held-out set (eval_path or eval_fraction)"
            )
        if self.group_column is not None and not self.has_eval_set:
            raise ValueError("data.group_column needs a held-out set (data.eval_path or data.eval_fraction)")
        # group names are printed; a column the model trains on holds free private text, refusable without a value
        trained = {
            "data.text_column": self.text_column,
            "data.prompt_column": self.prompt_column,
            "data.response_column": self.response_column,
            "data.messages_column": self.messages_key,
            "data.completion_column": self.completion_column,
        }
        for key, column in trained.items():
            if self.group_column is not None and self.group_column == column:
                raise ValueError(
                    f"data.group_column={excerpt(column, 60)} is {key}, training text: group names are printed, so "
                    "the group column must hold public labels (a published schema's categories)"
                )
        return self

    @property
    def has_eval_set(self) -> bool:
        """A held-out set is configured (``eval_path`` or ``eval_fraction``)."""
        return self.eval_path is not None or self.eval_fraction is not None

    @property
    def kind(self) -> str:
        """What one record is: ``text``, ``prompt_response`` or ``messages`` (``record_format`` resolved)."""
        if self.text_column is not None:
            return "text"
        if self.prompt_column is not None:
            return "prompt_response"
        return "messages"

    @property
    def messages_key(self) -> str | None:
        """The conversation column (``messages_column`` or ``messages``), or None for other record formats."""
        return (self.messages_column or DEFAULT_MESSAGES_COLUMN) if self.kind == "messages" else None

    @model_validator(mode="after")
    def _columns(self) -> DataSection:
        if self.completion_column is not None and self.kind != "messages":
            raise ValueError(
                "data.completion_column (TRL conversational prompt/completion: message lists) goes with "
                "data.messages_column (the prompt's messages), not with text/prompt/response columns"
            )
        if self.completion_column is not None and self.completion_column == self.messages_key:
            raise ValueError("data.completion_column must differ from data.messages_column")
        has_text = self.text_column is not None
        has_pair = self.prompt_column is not None or self.response_column is not None
        if has_text and has_pair:
            raise ValueError("data: give either data.text_column, or both data.prompt_column and data.response_column")
        if has_pair and (self.prompt_column is None or self.response_column is None):
            raise ValueError("data: give both data.prompt_column and data.response_column")
        if self.messages_column is not None and (has_text or has_pair):
            raise ValueError(
                "data: ambiguous record format: give data.messages_column (conversations) or data.text_column / "
                "data.prompt_column + data.response_column, not both"
            )
        if self.record_format != "auto" and self.record_format != self.kind:
            need = {
                "text": "data.text_column",
                "prompt_response": "data.prompt_column and data.response_column",
                "messages": "no text/prompt/response column (the conversations are in data.messages_column)",
            }[self.record_format]
            raise ValueError(
                f"data.record_format={self.record_format} needs {need}; the columns given read as {self.kind}"
            )
        return self


TARGET_KEYWORDS = ("auto", "all-linear")


def _targets_kind(v) -> str:
    return "<keyword>" if isinstance(v, str) else "<list>"


TargetModules = Annotated[
    Annotated[Literal["auto", "all-linear"], Tag("<keyword>")]
    | Annotated[tuple[Name, ...], Field(max_length=MAX_NAME_CHARS), Tag("<list>")],
    Discriminator(_targets_kind),
]


class LoraSection(_Section):
    """LoRA adapters (Hu et al. 2021) via peft: rank r, alpha, dropout and the target modules."""

    r: Annotated[int, Field(gt=0, le=MAX_LORA_RANK, strict=True)] = 8
    alpha: PositiveFloat = 16.0
    dropout: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False, strict=True)] = 0.0
    # auto: the model's attention projections, read from its module names after it loads; all-linear: peft's
    # shorthand for every linear layer but the output layer; else a list of module names
    target_modules: TargetModules = "auto"
    # FFA-LoRA (Sun et al., ICLR 2024, "Improving LoRA in Privacy-preserving Federated Learning"): every A stays at
    # its seeded initialisation (not trainable: no gradient, no noise, no update); only B is trained, which halves
    # (or more) the dimension the noise is spread over
    freeze_a: Annotated[bool, Field(strict=True)] = False

    @field_validator("target_modules", mode="before")
    @classmethod
    def _keyword(cls, v):
        if isinstance(v, str) and v not in TARGET_KEYWORDS:
            raise ValueError(
                f"lora.target_modules={excerpt(v)}: must be a list, e.g. [q_proj, v_proj], or auto or all-linear"
            )
        return v

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, v):
        if isinstance(v, str):
            return v
        if not v or any(not m for m in v):
            raise ValueError("lora.target_modules must be a non-empty list of module names")
        return v


class TrainingSection(_Section):
    """Logical/physical batching, length of training, optimiser, and where to write."""

    # "auto": the planner (dplora.plan.planner) picks B (and with steps: auto, T) from public inputs
    expected_batch_size: PositiveInt | Literal["auto"]
    # records per forward (memory only); "auto": probed before step 1 on synthetic batches (dplora.engine.membatch)
    physical_batch_size: PositiveInt | Literal["auto"] = 8
    gradient_checkpointing: Annotated[bool, Field(strict=True)] = False  # non-reentrant; the fast path only
    # E, passes over the N units; "auto" (with expected_batch_size: auto): the planner searches E up to max_epochs
    epochs: PositiveFloat | Literal["auto"] | None = None
    max_epochs: Annotated[float, Field(ge=1, le=MAX_EPOCHS, allow_inf_nan=False, strict=True)] | None = None
    steps: Annotated[int, Field(gt=0, le=MAX_STEPS, strict=True)] | Literal["auto"] | None = None
    # "auto" (with expected_batch_size: auto): the reference rate at B = 32 from the declared data.task
    # (dplora.plan.planner.TASK_REFERENCE_LR), scaled by the planner like a number
    lr: Annotated[float, Field(gt=0, le=MAX_LR, allow_inf_nan=False, strict=True)] | Literal["auto"] = 2e-3
    optimizer: Optimizer = Optimizer.ADAMW
    lr_schedule: LrSchedule | None = None  # None: constant, or the planner's choice with expected_batch_size: auto
    warmup_steps: Annotated[int, Field(ge=0, le=MAX_STEPS, strict=True)] | None = None
    weight_decay: Annotated[float, Field(ge=0, le=10, allow_inf_nan=False, strict=True)] = 0.0
    max_seq_len: Annotated[int, Field(gt=1, le=8192, strict=True)] = DEFAULT_MAX_SEQ_LEN
    seed: Annotated[int, Field(ge=0, lt=2**63, strict=True)] = 0
    output_dir: PathText = "runs/dplora"
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS, strict=True)] | None = None
    checkpoint_every: PositiveInt | None = None  # logical steps between resume checkpoints (None: ⌈T/10⌉)
    report_to: ReportTo = ReportTo.NONE  # public numbers only (step, ε spent, ε bound, σ, q, T)
    report_private: Annotated[bool, Field(strict=True)] = False  # also loss, batch sizes, times: not covered by DP
    # none: a whole base per rank; fsdp: the base sharded 1/W per rank (torch FSDP2), LoRA whole on every rank
    sharding: Sharding = Sharding.NONE

    @property
    def fixed_physical_batch_size(self) -> int:
        """``physical_batch_size`` as a number: ``auto`` reads as 8, the CPU default (evaluation, audits)."""
        return 8 if self.physical_batch_size == "auto" else self.physical_batch_size

    @model_validator(mode="after")
    def _length(self) -> TrainingSection:
        if self.steps == "auto" and self.expected_batch_size != "auto":
            raise ValueError("training.steps: auto needs training.expected_batch_size: auto (the planner picks both)")
        if self.epochs == "auto" and self.expected_batch_size != "auto":
            raise ValueError(
                "training.epochs: auto needs training.expected_batch_size: auto (the planner picks B and E together)"
            )
        if self.epochs == "auto" and self.max_epochs is None:
            raise ValueError(
                "training.epochs: auto needs training.max_epochs: the most passes over the units the planner may "
                "spend (a public compute budget, e.g. 20)"
            )
        if self.lr == "auto" and self.expected_batch_size != "auto":
            raise ValueError(
                "training.lr: auto needs training.expected_batch_size: auto (the planner sets the rate with B); "
                "with a fixed B give the rate as a number"
            )
        if self.lr == "auto" and self.optimizer not in (Optimizer.ADAMW, Optimizer.ADAM):
            raise ValueError(
                f"training.lr: auto is the rate measured for AdamW and Adam; with training.optimizer="
                f"{self.optimizer.value} give the rate as a number"
            )
        if self.max_epochs is not None and self.epochs != "auto":
            raise ValueError("training.max_epochs caps training.epochs: auto; with a number of epochs, drop it")
        if self.steps == "auto" or self.expected_batch_size == "auto":
            return self  # the planner: epochs (default 3) is the compute budget, an integer steps caps T
        if (self.epochs is None) == (self.steps is None):
            raise ValueError("training: give exactly one of training.epochs or training.steps")
        return self

    @property
    def is_auto(self) -> bool:
        """The planner picks B (and T): ``expected_batch_size: auto``."""
        return self.expected_batch_size == "auto"


def _check_fsdp(contract: Contract) -> None:
    """``training.sharding: fsdp`` needs the fast per-example path, NO 4-bit base and a fixed physical batch.

    Raises:
        ValueError: one line naming the key to change (the contract loader turns it into exit 2).
    """
    if contract.privacy.per_sample is PerSamplePath.OPACUS:
        raise ValueError(
            "training.sharding=fsdp needs privacy.per_sample=fast: Opacus hooks would record the all-gathered base "
            "weights' forward twice under FSDP's resharding"
        )
    if contract.model.quantization is not Quantization.NONE:
        raise ValueError(
            "training.sharding=fsdp with model.quantization=4bit (FSDP-QLoRA) is not built: use sharding none "
            "with a 4-bit base, or fsdp with a bf16/fp32 base"
        )
    if contract.training.physical_batch_size == "auto":
        raise ValueError(
            "training.sharding=fsdp needs a number for training.physical_batch_size: every rank must run the same "
            "forwards, and a per-rank memory probe may choose differently on each"
        )


class Contract(_Section):
    """The whole validated contract. Immutable; :attr:`sha256` is the digest of the resolved YAML."""

    privacy: PrivacySection
    model: ModelSection
    data: DataSection
    lora: LoraSection = LoraSection()
    training: TrainingSection

    @model_validator(mode="after")
    def _checkpointing_path(self) -> Contract:
        if self.training.gradient_checkpointing and self.privacy.per_sample is PerSamplePath.OPACUS:
            raise ValueError(
                "training.gradient_checkpointing=true needs privacy.per_sample=fast: recomputed forwards re-fire "
                "Opacus hooks"
            )
        if self.training.sharding is Sharding.FSDP:
            _check_fsdp(self)
        if self.training.physical_batch_size == "auto" and self.privacy.per_sample is PerSamplePath.OPACUS:
            raise ValueError(
                "training.physical_batch_size=auto needs privacy.per_sample=fast: an out-of-memory error inside "
                "the model leaves Opacus's per-parameter forward counters mid-step, so it cannot be probed or retried; "
                "give a number"
            )
        return self

    @model_validator(mode="after")
    def _group_is_not_the_unit(self) -> Contract:
        # group names are printed; the unit key names a protected person or ticket, so it is never a public label
        group = self.data.group_column
        if group is not None and group == self.privacy.unit_key:
            raise ValueError(
                f"data.group_column={excerpt(group, 60)} is privacy.unit_key: group names are printed, and a unit "
                "key names a protected unit; the group column must hold public labels"
            )
        return self

    @model_validator(mode="after")
    def _reference_lr(self) -> Contract:
        lr = self.training.lr
        if self.training.expected_batch_size == "auto" and lr != "auto" and lr > MAX_REFERENCE_LR:
            shown = f"{lr:g}" if float(f"{lr:g}") == lr else repr(lr)  # never shown rounded onto the bound
            raise ValueError(
                f"training.lr={shown}: with expected_batch_size: auto it is the rate at B = 32, which the planner "
                f"scales by sqrt(B/32) up to B = {PLANNER_TOP_BATCH}: at most {MAX_REFERENCE_LR:g}, so the rate run "
                f"is ≤ {MAX_LR}"
            )
        return self

    def to_yaml(self) -> str:
        """The resolved contract (overrides applied) as YAML with enums as plain strings."""
        dumped = self.model_dump(mode="json")
        if dumped["data"].get("public_warm_start") is None:  # absent: the YAML (and digest) of contracts before it
            dumped["data"].pop("public_warm_start", None)
        if dumped["data"].get("task") == "generation":  # the default: contracts before classification unchanged
            for key in ("task", "labels", "labels_file", "calibration_input"):
                dumped["data"].pop(key, None)
        if dumped["data"].get("calibration") is None:  # absent: the YAML (and digest) of contracts before it
            dumped["data"].pop("calibration", None)
        if dumped["training"].get("sharding") == Sharding.NONE.value:  # the default: contracts before it unchanged
            dumped["training"].pop("sharding", None)
        if dumped["training"].get("max_epochs") is None:  # absent: the YAML (and digest) of contracts before it
            dumped["training"].pop("max_epochs", None)
        return yaml.safe_dump(dumped, sort_keys=False)

    @property
    def sha256(self) -> str:
        """sha256 hex of :meth:`to_yaml`, the contract the run actually used."""
        return hashlib.sha256(self.to_yaml().encode("utf-8")).hexdigest()
