"""`llmcap rollout predict | export | start`: gradual traffic to a candidate deployment.

    llmcap rollout predict --trace FILE --model M --gpu G [--tp N ...] [--request-rate R] [--steps 0.01,...] -o P.json
    llmcap rollout export --predictions P.json --app NAME [--namespace NS] [--replicas N] [--approve-before 0.25,1] -o DIR
    llmcap rollout start --gateway URL --candidate-metrics URL --predictions P.json [--approve-before 0.25,1] ...

`predict` simulates the candidate at each step's share of the traffic (simulated, not measured): the
limits every gate judges against. `export` writes them as an Argo Rollouts Rollout + AnalysisTemplates
and Gateway API HTTPRoutes. `start` runs the Prefect flow `rollout` against a running `llmcap gateway`
(approvals need a Prefect server: `python -m flows.server start`; give them with `llmcap approve`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from llmcap.catalog import get_gpu, load_model
from llmcap.commands._common import err_console, user_errors
from llmcap.commands._deployment import (
    EngineOptions,
    GpuMemUtilOpt,
    GpuOpt,
    KvBlockSizeOpt,
    KvDtypeOpt,
    MaxBatchedOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    QuantOpt,
    TpOpt,
    sim_config,
    step_model,
)
from llmcap.commands._trace_input import positive, read_trace_input
from llmcap.errors import LlmcapError

app = typer.Typer(help="Gradual traffic: predict each step's gates, export them for Argo Rollouts, run the rollout flow.", no_args_is_help=True)

DEFAULT_STEPS = "0.01,0.05,0.25,0.5,1"
StepsOpt = Annotated[str, typer.Option("--steps", help="traffic shares of the candidate, increasing, in (0, 1]")]
ApproveOpt = Annotated[str, typer.Option("--approve-before", help="steps that wait for a person's approval (comma list; empty: none)")]


def weights(text: str, option: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LlmcapError(f"{option} takes comma-separated shares such as 0.05,0.25,1, not {text!r}") from None


@app.command("predict")
@user_errors
def predict(
    trace: Annotated[Path, typer.Option("--trace", "-t", help="the traffic: canonical Parquet or any format `llmcap trace` reads")],
    model: ModelOpt,
    gpu: GpuOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="the predictions file to write (JSON)")],
    tp: TpOpt = 1,
    quant: QuantOpt = "bf16",
    kv_dtype: KvDtypeOpt = "bf16",
    max_num_seqs: MaxNumSeqsOpt = 256,
    max_num_batched_tokens: MaxBatchedOpt = 8192,
    block_size: KvBlockSizeOpt = 16,
    gpu_memory_utilization: GpuMemUtilOpt = 0.90,
    request_rate: Annotated[float | None, typer.Option("--request-rate", help="the whole traffic's rate, req/s (default: the trace's)")] = None,
    steps: StepsOpt = DEFAULT_STEPS,
    seed: Annotated[int, typer.Option(help="seed of each step's thinning")] = 0,
) -> None:
    """Simulate the candidate (one instance of MODEL on GPU) at each step's share of the traffic."""
    from llmcap.rollout.driver import RolloutPlan
    from llmcap.rollout.predict import predict_share, predictions_doc
    from llmcap.trace import mean_rate
    from llmcap.trace.synth import scale_rate

    shares = RolloutPlan(steps=weights(steps, "--steps")).steps
    positive("--request-rate", request_rate)
    spec, g = load_model(model), get_gpu(gpu)
    opts = EngineOptions(tp=tp, quant=quant, kv_dtype=kv_dtype, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         block_size=block_size, gpu_memory_utilization=gpu_memory_utilization)  # fmt: skip
    cfg = sim_config(spec, g, opts)
    source = read_trace_input(trace, "auto", "auto", None, None, False, 1.0, "by_id", announce=True).trace
    rate = request_rate or mean_rate(source)
    scaled = scale_rate(source, rate)
    step = step_model(model, gpu, tp, quant, kv_dtype)
    preds = {}
    for w in shares:
        err_console.print(f"simulating the candidate at {w:.0%} of {rate:.3g} req/s ...")
        preds[w] = predict_share(scaled, cfg, step, w, seed)
    about = {"model": spec.name, "gpu": g.name, "tp": tp, "weight_quant": quant, "kv_dtype": kv_dtype, "request_rate": rate,
             "trace": str(trace)}  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(predictions_doc(preds, about), indent=1) + "\n", encoding="utf-8")
    for w in shares:
        p = preds[w]
        err_console.print(f"  {w:>6.0%}: {p.requests} requests, TTFT p99 {1000 * (p.ttft.quantile(0.99) or 0):.0f} ms, "
                          f"ITL p99 {1000 * (p.itl.quantile(0.99) or 0):.1f} ms, KV max {p.kv_usage_max:.0%} (simulated)")  # fmt: skip
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
    hold_s: Annotated[float, typer.Option("--hold-s", min=1.0, help="each step's hold (and analysis window), s")] = 300.0,
    interval_s: Annotated[float, typer.Option("--interval-s", min=1.0, help="between analysis measurements, s")] = 30.0,
    ttft_target_ms: Annotated[float, typer.Option("--ttft-target-ms", min=1.0, help="the TTFT SLO the attainment gate counts against")] = 2000.0,
    prometheus: Annotated[str, typer.Option(help="the Prometheus server the analyses query")] = "http://prometheus.monitoring:9090",
    gateway: Annotated[str, typer.Option(help="the Gateway API Gateway the HTTPRoute attaches to")] = "inference-gateway",
    image: Annotated[str, typer.Option(help="the engine image")] = "vllm/vllm-openai:latest",
    port: Annotated[int, typer.Option(min=1, max=65535, help="the engine's port")] = 8000,
) -> None:
    """Write the rollout as an Argo Rollouts Rollout + AnalysisTemplates and Gateway API HTTPRoutes."""
    from llmcap.rollout.driver import RolloutPlan
    from llmcap.rollout.export import ClusterNames, cluster_objects, yaml_documents
    from llmcap.rollout.gates import Tolerances
    from llmcap.rollout.predict import load_predictions

    preds = load_predictions(predictions)
    plan = RolloutPlan(tuple(sorted(preds)), hold_s, interval_s, weights(approve_before, "--approve-before"), ttft_target_ms / 1000.0)
    names = ClusterNames(app=app_name, namespace=namespace, gateway=gateway, port=port, prometheus=prometheus, image=image)
    out.mkdir(parents=True, exist_ok=True)
    for name, docs in cluster_objects(names, plan, preds, Tolerances(), replicas).items():
        (out / name).write_text(yaml_documents(docs), encoding="utf-8")
        print(f"{len(docs)} object(s) → {out / name}")


@app.command("start")
@user_errors
def start(
    gateway: Annotated[str, typer.Option("--gateway", help="the running `llmcap gateway`'s URL")],
    candidate_metrics: Annotated[str, typer.Option("--candidate-metrics", help="the candidate engine's base URL (its /metrics)")],
    predictions: Annotated[Path, typer.Option("--predictions", help="`llmcap rollout predict`'s file")],
    steps: StepsOpt = DEFAULT_STEPS,
    hold_s: Annotated[float, typer.Option("--hold-s", min=0.1, help="each step's hold, s")] = 60.0,
    interval_s: Annotated[float, typer.Option("--interval-s", min=0.1, help="between evaluations, s (a breach is acted on within one)")] = 5.0,
    approve_before: ApproveOpt = "",
    approval_timeout_s: Annotated[int, typer.Option("--approval-timeout-s", min=1, help="an approval not given by then rolls back")] = 3600,
    ttft_target_ms: Annotated[float, typer.Option("--ttft-target-ms", min=1.0)] = 2000.0,
    tolerances: Annotated[str | None, typer.Option(help='gate tolerances as JSON, e.g. \'{"ttft_p99_rel": 0.3, "min_requests": 50}\'')] = None,
    prometheus: Annotated[str | None, typer.Option(help="read the gates from this Prometheus server (jobs --gateway-job, --engine-job)")] = None,
    gateway_job: Annotated[str, typer.Option()] = "gateway",
    engine_job: Annotated[str, typer.Option()] = "candidate",
    out: Annotated[Path | None, typer.Option("--out", help="directory for outcome.json")] = None,
    project: Annotated[Path, typer.Option("--project", "-p", help="project directory holding flows/")] = Path("."),
) -> None:
    """Run the Prefect flow `rollout`: steps, gates against the predictions, automatic rollback, approvals."""
    root = project.resolve()
    if not (root / "flows" / "rollout.py").is_file():
        raise LlmcapError(f"{root}: not an llmcap project (needs flows/rollout.py); run from the repository root")
    weights(steps, "--steps"), weights(approve_before, "--approve-before")  # fail here, not in the flow
    if tolerances is not None:
        from pydantic import ValidationError

        from llmcap.rollout.gates import Tolerances

        try:
            Tolerances.model_validate_json(tolerances)
        except ValidationError as exc:
            raise LlmcapError(f"--tolerances: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
    args = ["--gateway", gateway, "--candidate-metrics", candidate_metrics, "--predictions", str(predictions.resolve()),
            "--steps", steps, "--hold-s", f"{hold_s:g}", "--interval-s", f"{interval_s:g}", "--approve-before", approve_before,
            "--approval-timeout-s", str(approval_timeout_s), "--ttft-target-ms", f"{ttft_target_ms:g}",
            "--gateway-job", gateway_job, "--engine-job", engine_job, "--project", str(root)]  # fmt: skip
    if prometheus:
        args += ["--prometheus", prometheus]
    if tolerances is not None:
        args += ["--tolerances", tolerances]
    if out is not None:
        args += ["--out", str(out.resolve())]
    raise typer.Exit(subprocess.call([sys.executable, "-m", "flows.rollout", *args], cwd=root))
