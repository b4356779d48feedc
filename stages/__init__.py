"""Thin DVC stages: params + paths in → one llmcap call → outputs, validation, MLflow logging.

Each stage module has a `main()` run by `dvc repro` as `python -m stages.<name> ...`; `dvc.yaml`
owns every path (passed as arguments) and `params.yaml` owns the knobs.
"""
