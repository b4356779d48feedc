"""Typed models of `params.yaml` (the knobs; `dvc.yaml` owns the paths).

Each stage reads only its own section. Unknown keys are errors, so a typo in params.yaml fails loudly
instead of silently falling back to a default. Validation is complete at load (`load_params`): types are
strict (YAML's `true` is not a 1, "3" is not a 3; an int still passes for a float), floats are finite,
every range is checked, and GPU, weight-format, KV-dtype and model names are looked up in the catalogs,
so a bad value fails at once with its field named instead of later with a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from llmcap.candidates import EnumerationSpec, workload_context_lengths
from llmcap.catalog.gpus import GpuCatalog, load_gpu_catalog
from llmcap.credentials import check_env_name, redact_text, split_userinfo
from llmcap.engine_presets import ENGINE_ADMISSIONS, EnginePreset, presets_for
from llmcap.errors import InputFileError, LlmcapError
from llmcap.reconcile.params import ReconcileParams
from llmcap.sizing.params import AutoscaleParams, SizeParams
from llmcap.trace.params import (  # noqa: F401 (re-exported: params.yaml's trace sections)
    CANONICAL_MAPPABLE,
    ArrivalSpec,
    CharacteriseParams,
    CleanParams,
    ExcludeRule,
    Percentile,
    PositiveInt,
    StrictParams,
    TimeUnit,
    TraceFormat,
    TraceParams,
)

_Strict = StrictParams  # every section's base


class EnumerateParams(EnumerationSpec):
    """Stage `enumerate`: the model to plan for plus the candidate grid (`llmcap.candidates.EnumerationSpec`)."""

    model: str = Field("Llama-3.1-70B", min_length=1)
    """Catalog model name (llmcap/catalog/data/models/) or a path to a config.json or its directory."""
    max_context_len: int | Literal["model", "workload"] = Field(default="workload")  # type: ignore[assignment]
    """Longest ISL + OSL a deployment must accept: tokens, "model" (max_position_embeddings) or
    "workload" (the trace's longest ISL + longest OSL, from the characterise stage's summary)."""
    engine: Literal["vllm", "sglang", "trtllm"] | None = None
    """The serving engine's own defaults on each GPU (`llmcap.engine_presets`: its chunk, max batch and KV block
    for every role instead of the scheduler grids above, and its admission policy for `size`); null: the grids."""

    def presets(self, catalog: GpuCatalog | None = None) -> dict[str, EnginePreset]:
        """Each grid GPU's preset of `engine` (none without one)."""
        gpus = catalog or load_gpu_catalog()
        return presets_for(self.engine, [gpus.get(g) for g in self.gpus])

    @field_validator("max_context_len", mode="before")
    @classmethod
    def _tokens_or_keyword(cls, value: object) -> object:
        # one message for the whole union (pydantic would report each member under its own extra loc entry)
        if value in ("model", "workload") and isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        raise ValueError(f"must be a positive number of tokens, 'model' or 'workload' (got {value!r})")

    def grid(self, workload: Mapping[str, Any] | None = None) -> EnumerationSpec:
        """The plain EnumerationSpec, with max_context_len resolved against the workload summary."""
        data = self.model_dump(exclude={"model", "engine"})
        if self.max_context_len == "model":
            data["max_context_len"] = None
        elif self.max_context_len == "workload":
            if workload is None:
                raise LlmcapError("enumerate.max_context_len is 'workload' but no workload summary was given")
            data["max_context_len"] = workload_context_lengths(workload)["max"]
        return EnumerationSpec.model_validate(data)


def endpoint_without_secrets(value: str | None, key_field: str) -> str | None:
    """An endpoint param: an http(s) URL with a host and no credential in it (`key_field` names where the key goes)."""
    # Messages here never quote the URL: it may hold the very secret being refused.
    if value is None:
        return value
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ValueError("is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000")
    # params.yaml is committed, and DVC copies every param value into dvc.lock: no credential may live here
    if split_userinfo(value)[1] is not None or redact_text(value) != value:
        raise ValueError(
            "carries a credential (user:password@ or a token in the query); params.yaml and dvc.lock are "
            f"committed, so put the key in an environment variable and name it in {key_field}"
        )
    return value


def env_name(value: str | None) -> str | None:
    if value is not None:
        try:
            check_env_name(value)
        except LlmcapError as exc:
            raise ValueError(str(exc)) from None
    return value


class ProfileParams(_Strict):
    """Stage `profile`: the environment the plan targets (its fingerprint) and how to (re-)profile it.

    The model is `enumerate.model`. A stored profile is reused only when its fingerprint equals the
    one these knobs describe; otherwise it is stale and the stage re-profiles `endpoint` (if set) or
    falls back to the roofline model, loudly.
    """

    endpoint: str | None = Field(None, description="OpenAI-compatible base URL to profile, e.g. http://127.0.0.1:8000")
    api_key_env: str | None = Field(
        None,
        description="environment variable holding the endpoint's API key (sent as a Bearer token); "
        "null: LLMCAP_API_KEY if set, else no key",
    )
    served_model: str | None = Field(None, description="model name the endpoint serves (default: enumerate.model)")
    engine: str = "vllm"
    engine_version: str | None = None
    engine_commit: str | None = None
    driver_version: str | None = None
    runtime_version: str | None = None
    gpu: str = Field("H100-SXM-80GB", description="catalog GPU name or alias")
    interconnect: str | None = None
    model_revision: str | None = None
    weight_quant: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = Field(4, ge=1)
    pp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    dp: int = Field(1, ge=1)
    block_size: int | None = Field(16, ge=1)
    max_num_seqs: int | None = Field(256, ge=1)
    max_num_batched_tokens: int | None = Field(8192, ge=1)
    enable_chunked_prefill: bool | None = True
    enable_prefix_caching: bool | None = True
    scheduler: dict[str, str | int | float | bool | None] = Field(default_factory=dict)
    isl: list[PositiveInt] = Field(
        default_factory=lambda: [128, 512, 2048, 8192], min_length=1, description="profiled prompt lengths"
    )
    concurrency: list[PositiveInt] = Field(
        default_factory=lambda: [1, 4, 16], min_length=1, description="profiled concurrency levels"
    )
    osl: int = Field(128, ge=2)
    repeats: int = Field(3, ge=1)
    cache_hits: list[Annotated[float, Field(gt=0, lt=1)]] = Field(
        default_factory=list, description="prefix-cache hit shares to time TTFT at besides 0 (with endpoint)"
    )
    corrections_alias: str | None = Field(
        "champion",
        min_length=1,
        description="the written-back step-time corrections a plan applies: the version this alias names, per "
        "configuration (`llmcap correct`); null applies none",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint_without_secrets(cls, value: str | None) -> str | None:
        return endpoint_without_secrets(value, "profile.api_key_env")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return env_name(value)

    @field_validator("scheduler", mode="before")
    @classmethod
    def _scalar_knobs(cls, value: object) -> object:
        # one message per knob instead of pydantic's one per member of the value union
        if isinstance(value, dict):
            for key, knob in value.items():
                if not (knob is None or isinstance(knob, (str, int, float, bool))):
                    raise ValueError(
                        f"knob {key!r} must be a string, number, boolean or null (got {type(knob).__name__})"
                    )
                if isinstance(knob, float) and not math.isfinite(knob):
                    raise ValueError(f"knob {key!r} must be a finite number (got {knob})")
        return value


class ReplayParams(_Strict):
    """Stage `replay` (step 5): the chosen plan's unit replayed open loop at scales of its predicted max rate.

    With no `endpoint` the stage serves the unit's digital twin (`llmcap twin serve`) and says so loudly:
    its figures are the simulator's, not a measurement of a real engine.
    """

    endpoint: str | None = Field(
        None,
        description="OpenAI-compatible base URL of one instance (or one P+D pair) of the "
        "chosen configuration; null: the unit's digital twin",
    )
    api_key_env: str | None = Field(
        None, description="environment variable holding the endpoint's API key; null: LLMCAP_API_KEY if set"
    )
    served_model: str | None = Field(None, description="model name the endpoint serves (default: its first model)")
    rate_scales: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=lambda: [0.8, 1.0, 1.2],
        min_length=2,
        description="multiples of the load where the simulator predicts the unit stops holding its share of the trace; "
        "the lowest must hold, the highest must fail",
    )
    excerpt_requests: int = Field(
        480,
        ge=2,
        description="requests per run: the unit's share of one window of the trace (the window is the same at every "
        "scale); each run's attainment is judged with a 95% bound, and a 99% target needs ≥ 381 judged requests "
        "(of the 80% a run judges) to hold",
    )
    excerpt_seeds: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: [0], min_length=1, description="each seed replays another window of the trace"
    )
    isl_buckets: list[PositiveInt] = Field(
        default_factory=lambda: [4096, 16384], description="ISL bucket edges (tokens)"
    )
    osl_buckets: list[PositiveInt] = Field(default_factory=lambda: [256], description="OSL bucket edges (tokens)")
    twin_dilation: float = Field(
        0.2, gt=0, description="twin only: wall seconds per simulated second (0.2: five times faster)"
    )
    twin_slowdown: float = Field(
        1.0,
        gt=0,
        description="twin only, a fault: every engine step takes this many times its simulated "
        "time (exercises reconciliation and the corrections it writes back)",
    )
    max_lateness_ms: float = Field(50.0, gt=0, description="a send later than this (wall clock) makes a run invalid")
    timeout_s: float = Field(
        120.0, gt=0, description="per-read timeout of a stream, simulated seconds (a miss, not a retry)"
    )
    max_drain_s: float = Field(
        120.0, gt=0, description="requests still streaming this long after the last send are cut (unfinished)"
    )
    vocab_size: int = Field(1000, ge=8, description="prompt token ids are drawn from [4, vocab_size)")
    require: Literal["none", "valid", "confirmed"] = Field(
        "none",
        description="what `make plan` (flows.replan) requires of this check to exit 0: none (the decision is recorded either "
        "way, marked confirmed or not), valid (no INVALID run), confirmed (valid, and the verdict confirmed)",
    )

    @field_validator("endpoint")
    @classmethod
    def _endpoint_without_secrets(cls, value: str | None) -> str | None:
        return endpoint_without_secrets(value, "replay.api_key_env")

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        return env_name(value)

    @field_validator("rate_scales", "isl_buckets", "osl_buckets")
    @classmethod
    def _increasing(cls, value: list) -> list:
        if any(b <= a for a, b in pairwise(value)):
            raise ValueError(f"must be strictly increasing (got {value})")
        return value


class WatchParams(_Strict):
    """The Prefect deployments `watch` (re-plan on an upgrade) and `replan` (scheduled), served by `flows.serve`.

    No DVC stage reads this section: it says when to plan, not what a plan computes.
    """

    interval_s: int = Field(3600, ge=10, description="seconds between two `watch` runs")
    replan_cron: str | None = Field("0 6 * * 1", description="cron of the scheduled re-plan (null: none)")
    endpoints: list[str] = Field(
        default_factory=list, description="base URLs whose environment is watched (default: profile.endpoint)"
    )
    fingerprint_file: str | None = Field(
        None, description="operator-written JSON/YAML of fingerprint fields, e.g. driver_version"
    )
    approval_timeout_s: int = Field(86400, ge=1, description="a plan not approved within this is left unpromoted")

    @field_validator("replan_cron")
    @classmethod
    def _five_fields(cls, value: str | None) -> str | None:
        if value is not None and len(value.split()) != 5:
            raise ValueError(f"a cron expression has 5 fields: minute hour day month weekday (got {value!r})")
        return value


class StoresParams(_Strict):
    """Where decisions are stored: one setting a clone picks up (stages.env.stores resolves it).

    No DVC stage reads this section: it says where a plan is kept, not what it computes. Empty: the
    checkout's own stores (`.dvc/config`'s default remote, `.work/mlflow.db`); the environment variables
    LLMCAP_DVC_REMOTE and MLFLOW_TRACKING_URI override it.
    """

    dvc_remote: str = Field(
        "", description="DVC remote URL or path (relative: to the project); '': .dvc/config's default remote"
    )
    mlflow_tracking_uri: str = Field(
        "", description="MLflow tracking URI, e.g. http://host:5000; '': sqlite .work/mlflow.db"
    )

    @field_validator("dvc_remote", "mlflow_tracking_uri")
    @classmethod
    def _no_credential(cls, value: str) -> str:
        # params.yaml is committed: credentials belong in DVC's config.local or MLFLOW_TRACKING_USERNAME/PASSWORD
        if split_userinfo(value)[1] is not None or redact_text(value) != value:
            raise ValueError(
                "carries a credential (user:password@ or a token); put it in the environment, not params.yaml"
            )
        return value


class ApprovalsParams(_Strict):
    """Who may approve a re-plan (flows.promote checks it; no DVC stage reads this section).

    The approver is the git identity of the process that runs `llmcap approve`, signed with the project's
    approval key (ops.approvals): a name typed into the Prefect UI or posted to its API is not an approver.
    """

    approvers: list[str] = Field(
        default_factory=list,
        description="git emails allowed to approve or reject ([]: anyone holding the approval key)",
    )
    distinct_from_trigger: bool = Field(False, description="the approver must not be whoever triggered the re-plan")

    @field_validator("approvers")
    @classmethod
    def _emails(cls, value: list[str]) -> list[str]:
        for email in value:
            if "@" not in email or email != email.strip() or "<" in email:
                raise ValueError(f"an approver is a git email like alice@example.com (got {email!r})")
        return value


class Params(_Strict):
    """The whole of params.yaml."""

    seed: int = Field(0, ge=0)
    trace: TraceParams
    clean: CleanParams = CleanParams()
    characterise: CharacteriseParams = CharacteriseParams()
    enumerate: EnumerateParams = EnumerateParams()
    profile: ProfileParams = ProfileParams()
    size: SizeParams = SizeParams()
    autoscale: AutoscaleParams = AutoscaleParams()
    replay: ReplayParams = ReplayParams()
    reconcile: ReconcileParams = ReconcileParams()
    watch: WatchParams = WatchParams()
    stores: StoresParams = StoresParams()
    approvals: ApprovalsParams = ApprovalsParams()

    @model_validator(mode="after")
    def _one_admission(self) -> Params:
        # an engine preset brings its admission policy: a size.admission_policy written beside it must be one of that engine's
        engine = self.enumerate.engine
        offered = ENGINE_ADMISSIONS[engine] if engine else ()
        if offered and "admission_policy" in self.size.model_fields_set and self.size.admission_policy not in offered:
            raise ValueError(
                f"size.admission_policy {self.size.admission_policy!r} contradicts enumerate.engine {engine!r}, "
                f"whose admission is {' or '.join(offered)}: drop size.admission_policy or set one of those"
            )
        return self

    def sizing(self) -> SizeParams:
        """`size`, with the engine preset's admission policy where enumerate.engine names one and size sets none."""
        engine = self.enumerate.engine
        if engine and "admission_policy" not in self.size.model_fields_set:
            return self.size.model_copy(update={"admission_policy": ENGINE_ADMISSIONS[engine][0]})  # its default first
        return self.size


def load_params(path: str | Path = "params.yaml", catalog_dir: str | Path | None = None) -> Params:
    """Read and validate params.yaml completely; the first bad key or value is one clear error naming its field.

    Names are checked against the catalogs in `catalog_dir` (default: llmcap/catalog/data): GPUs, weight
    formats and KV dtypes of `enumerate` and `profile`, and `enumerate.model` (a catalog name or a path).
    """
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise InputFileError(path, "params file not found") from None
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", None)
        # one line: the problem, not PyYAML's quoted snippet (that line may hold an endpoint's password)
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise InputFileError(
            path, f"not valid YAML: {redact_text(problem)}", line=None if line is None else line + 1
        ) from None
    if not isinstance(raw, dict):
        raise InputFileError(path, f"must be a mapping of sections (trace, clean, ...), not a {type(raw).__name__}")
    try:
        params = Params.model_validate(raw)
    except ValidationError as exc:
        field, message = _describe(exc.errors(include_url=False))
        raise InputFileError(path, message, field=field) from None
    search = params.size.search
    if search.min_rate >= search.max_rate:  # here, not in SearchParams: the search itself reports it for callers
        raise InputFileError(
            path,
            f"must be below size.search.max_rate ({search.max_rate:g}) (got {search.min_rate:g})",
            field="size.search.min_rate",
        )
    for field, message in catalog_problems(params, catalog_dir):
        raise InputFileError(path, message, field=field)
    return params


def _describe(errors: list[Any]) -> tuple[str, str]:
    """(dotted field path, message) of the first error; the message says what came in and how many more are wrong."""
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    got = first.get("input")
    if first["type"] not in ("value_error", "assertion_error", "missing", "extra_forbidden") and (
        got is None or isinstance(got, (bool, int, float)) or (isinstance(got, str) and len(got) <= 60)
    ):
        message += f" (got {redact_text(repr(got)) if isinstance(got, str) else got!r})"
    if len(errors) > 1:
        others = [".".join(str(p) for p in e["loc"]) for e in errors[1:]]
        shown = ", ".join(f"'{o}'" for o in others[:3]) + (", ..." if len(others) > 3 else "")
        message += f"; {len(others)} more error{'s' if len(others) > 1 else ''}: {shown}"
    return field, message


def catalog_problems(params: Params, catalog_dir: str | Path | None = None) -> Iterator[tuple[str, str]]:
    """(field, message) for every name in `params` that the catalogs do not know, in params.yaml order."""
    from llmcap.catalog.gpus import default_catalog_dir, load_gpu_catalog
    from llmcap.catalog.model_config import load_model
    from llmcap.catalog.quant import kv_dtype_bytes, weight_format

    catalog = Path(catalog_dir) if catalog_dir is not None else default_catalog_dir()
    gpus = load_gpu_catalog(catalog / "gpus.yaml")
    enum, prof = params.enumerate, params.profile
    checks: list[tuple[str, Callable[[str], object], str]] = [
        ("enumerate.model", lambda name: load_model(name, models_dir=catalog / "models"), enum.model)
    ]
    checks += [(f"enumerate.gpus.{i}", gpus.get, g) for i, g in enumerate(enum.gpus)]
    checks += [(f"enumerate.weight_quants.{i}", weight_format, q) for i, q in enumerate(enum.weight_quants)]
    checks += [(f"enumerate.kv_dtypes.{i}", kv_dtype_bytes, k) for i, k in enumerate(enum.kv_dtypes)]
    checks += [(f"enumerate.usd_per_gpu_hour.{g}", gpus.get, g) for g in enum.usd_per_gpu_hour]
    checks += [
        ("profile.gpu", gpus.get, prof.gpu),
        ("profile.weight_quant", weight_format, prof.weight_quant),
        ("profile.kv_dtype", kv_dtype_bytes, prof.kv_dtype),
    ]
    for field, lookup, name in checks:
        try:
            lookup(name)
        except LlmcapError as exc:
            yield field, str(exc)
