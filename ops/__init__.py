"""Operations on planning decisions: store (DVC remote), history (MLflow), reproduce and diff.

Project code like `flows/` and `stages/`: it may import DVC and MLflow; the domain library `llmcap`
never does, and its CLI commands (`llmcap history|reproduce|diff`) run these modules as
`python -m ops.<name>` subprocesses of the same interpreter.
"""
