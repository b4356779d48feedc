"""`llmcap rollout predict | export | start`: gradual traffic to a candidate deployment.

    llmcap rollout predict --trace FILE --model M --gpu G [--tp N ...] [--request-rate R] [--steps 0.01,...] -o P.json
    llmcap rollout export --predictions P.json --app NAME [--namespace NS] [--replicas N] [--approve-before 0.25,1] -o DIR
    llmcap rollout start --gateway URL --candidate-metrics URL --predictions P.json [--approve-before 0.25,1] ...
    llmcap rollout shadow --baseline URL --candidate URL --trace FILE --predictions P.json --share 0.25 [-o DIR]

`predict` simulates the candidate at each step's share of the traffic (simulated, not measured): the
limits every gate judges against. `export` writes them as an Argo Rollouts Rollout + AnalysisTemplates
and Gateway API HTTPRoutes. `start` runs the Prefect flow `rollout` against a running `llmcap gateway`
(approvals need a Prefect server: `python -m flows.server start`; give them with `llmcap approve`).
`shadow` runs the Prefect flow `shadow`: the trace replayed without and with a share mirrored to the
candidate, the candidate judged against its prediction, production's latency compared.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import err_console, user_errors
from llmcap.commands._deployment import (
    GpuMemUtilOpt,
    GpuOpt,
    KvBlockSizeOpt,
    KvDtypeOpt,
    MaxBatchedOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    ProfileOpt,
    QuantOpt,
    TpOpt,
)
from llmcap.commands._trace_input import positive, read_trace_input
from llmcap.deployment import ENGINE, EngineOptions, sim_config, step_model
from llmcap.errors import LlmcapError

if TYPE_CHECKING:  # the command imports the simulator stack when it runs, not when the CLI loads
    from llmcap.rollout.gates import Prediction
    from llmcap.sizing.measured import MeasuredProfile

app = typer.Typer(
    help="Gradual traffic: predict each step's gates, export them for Argo Rollouts, run the rollout flow.",
    no_args_is_help=True,
)

DEFAULT_STEPS = "0.01,0.05,0.25,0.5,1"
StepsOpt = Annotated[str, typer.Option("--steps", help="traffic shares of the candidate, increasing, in (0, 1]")]
ApproveOpt = Annotated[
    str, typer.Option("--approve-before", help="steps that wait for a person's approval (comma list; empty: none)")
]


def _project(project: Path, flow: str) -> Path:
    root = project.resolve()
    if not (root / "flows" / f"{flow}.py").is_file():
        raise LlmcapError(f"{root}: not an llmcap project (needs flows/{flow}.py); run from the repository root")
    return root


def _tolerances(text: str | None) -> None:
    """Fail on bad tolerances here, with one line, not in the flow."""
    if text is None:
        return
    from pydantic import ValidationError

    from llmcap.rollout.gates import Tolerances

    try:
        Tolerances.model_validate_json(text)
    except ValidationError as exc:
        raise LlmcapError(f"--tolerances: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None


TolerancesOpt = Annotated[
    str | None, typer.Option(help='gate tolerances as JSON, e.g. \'{"ttft_p99_rel": 0.3, "min_requests": 50}\'')
]


def weights(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LlmcapError(f"{option} takes comma-separated shares such as 0.05,0.25,1, not {text!r}") from None


PredictTraceOpt = Annotated[
    Path, typer.Option("--trace", "-t", help="the traffic: canonical Parquet or any format `llmcap trace` reads")
]
PredictionsOutOpt = Annotated[Path, typer.Option("--out", "-o", help="the predictions file to write (JSON)")]
TrafficRateOpt = Annotated[
    float | None, typer.Option("--request-rate", help="the whole traffic's rate, req/s (default: the trace's)")
]
ClientLatencyOpt = Annotated[
    float | None,
    typer.Option(
        "--client-latency-ms",
        min=0.0,
        help="the HTTP path's own share of TTFT "
        "(API server, gateway), added to every prediction (default: the profile's measured client overhead, else 0)",
    ),
]
ThinningSeedOpt = Annotated[int, typer.Option(help="seed of each step's thinning")]


@app.command("predict")
@user_errors
def predict(
    trace: PredictTraceOpt,
    model: ModelOpt,
    gpu: GpuOpt,
    out: PredictionsOutOpt,
    tp: TpOpt = ENGINE.tp,
    quant: QuantOpt = ENGINE.quant,
    kv_dtype: KvDtypeOpt = ENGINE.kv_dtype,
    max_num_seqs: MaxNumSeqsOpt = ENGINE.max_num_seqs,
    max_num_batched_tokens: MaxBatchedOpt = ENGINE.max_num_batched_tokens,
    block_size: KvBlockSizeOpt = ENGINE.block_size,
    gpu_memory_utilization: GpuMemUtilOpt = ENGINE.gpu_memory_utilization,
    request_rate: TrafficRateOpt = None,
    steps: StepsOpt = DEFAULT_STEPS,
    profile: ProfileOpt = None,
    client_latency_ms: ClientLatencyOpt = None,
    seed: ThinningSeedOpt = 0,
) -> None:
    """Simulate the candidate (one instance of MODEL on GPU) at each step's share of the traffic."""
    from llmcap.rollout.driver import RolloutPlan
    from llmcap.rollout.predict import predict_share, predictions_doc
    from llmcap.sizing.measured import load_profile
    from llmcap.trace import mean_rate
    from llmcap.trace.synth import scale_rate

    shares = RolloutPlan(steps=weights(steps, "--steps")).steps
    positive("--request-rate", request_rate)
    spec, g = load_model(model), get_gpu(gpu)
    opts = EngineOptions(
        tp=tp,
        quant=quant,
        kv_dtype=kv_dtype,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,
        gpu_memory_utilization=gpu_memory_utilization,
    )
    cfg = sim_config(spec, g, opts)
    measured = load_profile(profile) if profile is not None else None
    if measured is not None:
        measured.check_matches({"gpu": g.name, "tp": tp, "pp": 1, "ep": 1, "weight_quant": quant, "kv_dtype": kv_dtype})
    latency_s = _client_latency_s(client_latency_ms, measured)
    source = read_trace_input(trace, "auto", "auto", None, None, False, 1.0, "by_id", announce=True).trace
    rate = request_rate or mean_rate(source)
    scaled = scale_rate(source, rate)
    step = measured.fit.model if measured is not None else step_model(model, gpu, tp, quant, kv_dtype)
    preds = {}
    for w in shares:
        err_console.print(f"simulating the candidate at {w:.0%} of {rate:.3g} req/s ...")
        preds[w] = predict_share(scaled, cfg, step, w, seed, client_latency_s=latency_s)
    about = {
        "model": spec.name,
        "gpu": g.name,
        "tp": tp,
        "weight_quant": quant,
        "kv_dtype": kv_dtype,
        "request_rate": rate,
        "trace": str(trace),
        "step_times": measured.describe() if measured else f"the roofline for {g.name}",
        "client_latency_s": latency_s,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(predictions_doc(preds, about), indent=1) + "\n", encoding="utf-8")
    _show(preds, out)


def _client_latency_s(client_latency_ms: float | None, measured: MeasuredProfile | None) -> float:
    """The HTTP path's share of TTFT: --client-latency-ms, else the profile's measured client overhead, else 0."""
    if client_latency_ms is not None:
        return client_latency_ms / 1000.0
    return measured.fit.client_overhead_s if measured else 0.0


def _show(preds: dict[float, Prediction], out: Path) -> None:
    """Each step's prediction in one line on stderr, and where they were written on stdout."""
    for w, p in preds.items():
        err_console.print(
            f"  {w:>6.0%}: {p.requests} requests, TTFT p99 {1000 * (p.ttft.quantile(0.99) or 0):.0f} ms, "
            f"ITL p99 {1000 * (p.itl.quantile(0.99) or 0):.1f} ms, KV max {p.kv_usage_max:.0%} (simulated)"
        )
    print(f"rollout predictions (simulated, not measured) → {out}")


@app.command("export")
@user_errors
def export(
    predictions: Annotated[Path, typer.Option("--predictions", help="`llmcap rollout predict`'s file")],
    app_name: Annotated[str, typer.Option("--app", help="the Rollout's name and the pods' app label")],
    out: Annotated[Path, typer.Option("--out", "-o", help="directory for rollout.yaml and httproutes.yaml")],
    namespace: Annotated[str, typer.Option(help="Kubernetes namespace")] = "default",
    replicas: Annotated[int, typer.Option(min=1, help="the Rollout's replicas (the plan's instance count)")] = 1,
    approve_before: ApproveOpt = "",
    hold_s: Annotated[
        float, typer.Option("--hold-s", min=1.0, help="each step's hold (and analysis window), s")
    ] = 300.0,
    interval_s: Annotated[float, typer.Option("--interval-s", min=1.0, help="between analysis measurements, s")] = 30.0,
    ttft_target_ms: Annotated[
        float, typer.Option("--ttft-target-ms", min=1.0, help="the TTFT SLO the attainment gate counts against")
    ] = 2000.0,
    prometheus: Annotated[
        str, typer.Option(help="the Prometheus server the analyses query")
    ] = "http://prometheus.monitoring:9090",
    gateway: Annotated[
        str, typer.Option(help="the Gateway API Gateway the HTTPRoute attaches to")
    ] = "inference-gateway",
    image: Annotated[str, typer.Option(help="the engine image")] = "vllm/vllm-openai:latest",
    port: Annotated[int, typer.Option(min=1, max=65535, help="the engine's port")] = 8000,
) -> None:
    """Write the rollout as an Argo Rollouts Rollout + AnalysisTemplates and Gateway API HTTPRoutes."""
    from llmcap.rollout.driver import RolloutPlan
    from llmcap.rollout.export import ClusterNames, cluster_objects, yaml_documents
    from llmcap.rollout.gates import Tolerances
    from llmcap.rollout.predict import load_predictions

    preds = load_predictions(predictions)
    plan = RolloutPlan(
        tuple(sorted(preds)), hold_s, interval_s, weights(approve_before, "--approve-before"), ttft_target_ms / 1000.0
    )
    names = ClusterNames(
        app=app_name, namespace=namespace, gateway=gateway, port=port, prometheus=prometheus, image=image
    )
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in cluster_objects(names, plan, preds, Tolerances(), replicas).items():
        (out / name).write_text(yaml_documents(docs), encoding="utf-8")
        print(f"{len(docs)} object(s) → {out / name}")


@app.command("start")
@user_errors
def start(
    gateway: Annotated[str, typer.Option("--gateway", help="the running `llmcap gateway`'s URL")],
    candidate_metrics: Annotated[
        str, typer.Option("--candidate-metrics", help="the candidate engine's base URL (its /metrics)")
    ],
    predictions: Annotated[Path, typer.Option("--predictions", help="`llmcap rollout predict`'s file")],
    steps: StepsOpt = DEFAULT_STEPS,
    hold_s: Annotated[float, typer.Option("--hold-s", min=0.1, help="each step's hold, s")] = 60.0,
    interval_s: Annotated[
        float, typer.Option("--interval-s", min=0.1, help="between evaluations, s (a breach is acted on within one)")
    ] = 5.0,
    approve_before: ApproveOpt = "",
    approval_timeout_s: Annotated[
        int, typer.Option("--approval-timeout-s", min=1, help="an approval not given by then rolls back")
    ] = 3600,
    ttft_target_ms: Annotated[float, typer.Option("--ttft-target-ms", min=1.0)] = 2000.0,
    tolerances: TolerancesOpt = None,
    prometheus: Annotated[
        str | None, typer.Option(help="read the gates from this Prometheus server (jobs --gateway-job, --engine-job)")
    ] = None,
    gateway_job: Annotated[str, typer.Option()] = "gateway",
    engine_job: Annotated[str, typer.Option()] = "candidate",
    out: Annotated[Path | None, typer.Option("--out", help="directory for outcome.json")] = None,
    project: Annotated[Path, typer.Option("--project", "-p", help="project directory holding flows/")] = Path("."),
) -> None:
    """Run the Prefect flow `rollout`: steps, gates against the predictions, automatic rollback, approvals."""
    root = _project(project, "rollout")
    weights(steps, "--steps"), weights(approve_before, "--approve-before")  # fail here, not in the flow
    _tolerances(tolerances)
    args = [
        "--gateway",
        gateway,
        "--candidate-metrics",
        candidate_metrics,
        "--predictions",
        str(predictions.resolve()),
        "--steps",
        steps,
        "--hold-s",
        f"{hold_s:g}",
        "--interval-s",
        f"{interval_s:g}",
        "--approve-before",
        approve_before,
        "--approval-timeout-s",
        str(approval_timeout_s),
        "--ttft-target-ms",
        f"{ttft_target_ms:g}",
        "--gateway-job",
        gateway_job,
        "--engine-job",
        engine_job,
        "--project",
        str(root),
    ]
    if prometheus:
        args += ["--prometheus", prometheus]
    if tolerances is not None:
        args += ["--tolerances", tolerances]
    if out is not None:
        args += ["--out", str(out.resolve())]
    raise typer.Exit(subprocess.call([sys.executable, "-m", "flows.rollout", *args], cwd=root))


@app.command("shadow")
@user_errors
def shadow(
    baseline: Annotated[str, typer.Option("--baseline", help="the deployment serving production (URL)")],
    candidate: Annotated[str, typer.Option("--candidate", help="the deployment that gets the copies (URL)")],
    trace: Annotated[
        Path,
        typer.Option(
            "--trace", "-t", help="the traffic to replay: canonical Parquet or any format `llmcap trace` reads"
        ),
    ],
    predictions: Annotated[
        Path, typer.Option("--predictions", help="`llmcap rollout predict`'s file, holding --share")
    ],
    share: Annotated[
        float, typer.Option("--share", min=0.0, max=1.0, help="share of requests copied to the candidate")
    ],
    model: Annotated[
        str | None, typer.Option(help="the model name to send (default: the baseline's first /v1/models)")
    ] = None,
    request_rate: Annotated[
        float | None, typer.Option("--request-rate", help="replay the trace at this rate, req/s")
    ] = None,
    max_requests: Annotated[int | None, typer.Option("--max-requests", min=1, help="the first N requests only")] = None,
    ttft_target_ms: Annotated[float, typer.Option("--ttft-target-ms", min=1.0)] = 2000.0,
    tolerances: TolerancesOpt = None,
    impact_rel: Annotated[
        float, typer.Option("--impact-rel", min=0.0, help="production may be this much slower with the mirror ...")
    ] = 0.10,
    impact_abs_ms: Annotated[float, typer.Option("--impact-abs-ms", min=0.0, help="... plus this (ms)")] = 10.0,
    max_in_flight: Annotated[
        int, typer.Option("--max-in-flight", min=1, help="copies in flight at once; past it they are dropped (counted)")
    ] = 256,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="directory for shadow.md, summary.json and the rows")
    ] = None,
    project: Annotated[Path, typer.Option("--project", "-p", help="project directory holding flows/")] = Path("."),
) -> None:
    """Run the Prefect flow `shadow`: mirror a share to the candidate, judge it against its prediction, compare production."""
    root = _project(project, "shadow")
    _tolerances(tolerances)
    args = [
        "--baseline",
        baseline,
        "--candidate",
        candidate,
        "--trace",
        str(trace.resolve()),
        "--predictions",
        str(predictions.resolve()),
        "--share",
        f"{share:g}",
        "--ttft-target-ms",
        f"{ttft_target_ms:g}",
        "--impact-rel",
        f"{impact_rel:g}",
        "--impact-abs-ms",
        f"{impact_abs_ms:g}",
        "--max-in-flight",
        str(max_in_flight),
    ]
    for flag, value in (
        ("--model", model),
        ("--request-rate", request_rate),
        ("--max-requests", max_requests),
        ("--tolerances", tolerances),
        ("--out", None if out is None else out.resolve()),
    ):
        if value is not None:
            args += [flag, str(value)]
    raise typer.Exit(subprocess.call([sys.executable, "-m", "flows.shadow", *args], cwd=root))
