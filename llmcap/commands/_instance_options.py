"""Options naming one instance from the catalog (model, GPU, parallelism, KV dtype): `llmcap memory` and
`llmcap perf` declare them alike."""

from __future__ import annotations

from typing import Annotated

import typer

CatalogModelOpt = Annotated[
    str,
    typer.Option(
        "--model", "-m", help="Catalog model name (e.g. Llama-3.1-8B) or a path to config.json / its directory."
    ),
]
CatalogGpuOpt = Annotated[
    str, typer.Option("--gpu", "-g", help="GPU name or alias from llmcap/catalog/data/gpus.yaml (e.g. h100).")
]
TpDegreeOpt = Annotated[int, typer.Option(min=1, help="Tensor parallel degree.")]
PpDegreeOpt = Annotated[int, typer.Option(min=1, help="Pipeline parallel degree.")]
KvCacheDtypeOpt = Annotated[str, typer.Option(help="KV cache dtype: bf16, fp8, int8.")]
WEIGHT_FORMATS_HELP = "Weight format: bf16, fp8, fp8-block, int8, int4-awq[-gN], int4-gptq[-gN], nvfp4, mxfp4."
