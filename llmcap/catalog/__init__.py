"""Model and GPU catalog: specs parsed from HF config.json and llmcap/catalog/data/gpus.yaml, and weight/KV formats.

Public API:
    load_model(name_or_path) -> ModelSpec        parse_model_config(path) -> ModelSpec
    get_gpu(name) -> GpuSpec                     load_gpu_catalog(path=None) -> GpuCatalog
    weight_format(name) -> WeightFormat          kv_dtype_bytes(name) -> int
"""

from llmcap.catalog.gpus import GpuCatalog, GpuSpec, get_gpu, load_gpu_catalog
from llmcap.catalog.model_config import known_models, load_model, parse_model_config
from llmcap.catalog.models import ModelSpec, ParamCounts
from llmcap.catalog.quant import QuantPolicy, WeightFormat, kv_dtype_bytes, weight_format

__all__ = [
    "GpuCatalog",
    "GpuSpec",
    "ModelSpec",
    "ParamCounts",
    "QuantPolicy",
    "WeightFormat",
    "get_gpu",
    "known_models",
    "kv_dtype_bytes",
    "load_gpu_catalog",
    "load_model",
    "parse_model_config",
    "weight_format",
]
