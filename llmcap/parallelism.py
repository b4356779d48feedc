"""How a model shards over ranks: the parallelism (TP, PP, EP, DP), what rules a split out, the pipeline stages' layers and
each tensor's shape on one rank."""

from __future__ import annotations

from dataclasses import dataclass

from llmcap.catalog.models import ModelSpec, Tensor
from llmcap.errors import LlmcapError

VOCAB_PADDING = 64  # vLLM pads the vocabulary to a multiple of 64 before splitting it over TP


@dataclass(frozen=True)
class Parallelism:
    """tp x pp x dp GPUs per instance; ep shards routed experts (ep = 1 or a divisor of tp x dp)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def expert_tp(self) -> int:
        """How many ways each expert's matrices are split: TP without EP; (tp x dp) / ep with EP."""
        return self.tp if self.ep == 1 else (self.tp * self.dp) // self.ep

    def label(self) -> str:
        return f"TP{self.tp} PP{self.pp} EP{self.ep} DP{self.dp}"


def parallelism_issues(model: ModelSpec, par: Parallelism) -> list[tuple[str, str]]:
    """(code, message) for every way `par` cannot shard `model`; empty when it can."""
    issues: list[tuple[str, str]] = []
    if min(par.tp, par.pp, par.ep, par.dp) < 1:
        return [("bad_parallelism", f"parallel degrees must be >= 1, got {par.label()}")]
    tp = par.tp
    if model.num_heads % tp:
        issues.append(("heads_not_divisible_by_tp", f"{model.num_heads} attention heads are not divisible by TP={tp}"))
    if model.mla is None:
        kv = model.num_kv_heads
        if kv % tp and tp % kv:
            issues.append(
                ("kv_heads_incompatible_with_tp", f"{kv} KV heads: TP={tp} must divide them or be a multiple of them")
            )
    if model.intermediate_size and model.intermediate_size % tp:
        issues.append(("mlp_not_divisible_by_tp", f"MLP width {model.intermediate_size} is not divisible by TP={tp}"))
    if par.pp > model.num_layers:
        issues.append(("pp_exceeds_layers", f"PP={par.pp} exceeds the {model.num_layers} layers"))
    if model.moe is None or not model.is_moe:
        if par.ep > 1:
            issues.append(("ep_without_moe", f"EP={par.ep} on a model without experts"))
        return issues
    e = model.moe
    if par.ep > 1 and (tp * par.dp) % par.ep:
        issues.append(("ep_incompatible", f"EP={par.ep} must divide TP x DP = {tp * par.dp}"))
        return issues
    if e.num_experts % par.ep:
        issues.append(("experts_not_divisible_by_ep", f"{e.num_experts} experts are not divisible by EP={par.ep}"))
    etp = par.expert_tp
    if e.expert_intermediate_size % etp:
        issues.append(
            (
                "mlp_not_divisible_by_tp",
                f"expert width {e.expert_intermediate_size} is not divisible by expert TP={etp}",
            )
        )
    if e.shared_intermediate_size and e.shared_intermediate_size % tp:
        issues.append(
            ("mlp_not_divisible_by_tp", f"shared-expert width {e.shared_intermediate_size} is not divisible by TP={tp}")
        )
    return issues


def validate_parallelism(model: ModelSpec, par: Parallelism) -> None:
    """Raise one LlmcapError listing every problem with `par` for `model`."""
    issues = parallelism_issues(model, par)
    if issues:
        raise LlmcapError(f"{model.name} cannot run with {par.label()}: " + "; ".join(m for _, m in issues))


def pp_partition(num_layers: int, pp: int) -> list[int]:
    """Layers per PP stage as vLLM splits them: even split, leftovers to the stages before the last."""
    base = num_layers // pp
    parts = [base] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def pp_stage_layers(num_layers: int, pp: int) -> list[range]:
    out, start = [], 0
    for n in pp_partition(num_layers, pp):
        out.append(range(start, start + n))
        start += n
    return out


def kv_heads_per_rank(model: ModelSpec, tp: int) -> int:
    """KV heads each TP rank caches: n_kv / TP, or one replicated head when TP > n_kv. MLA: the latent (1)."""
    if model.mla is not None:
        return 1
    return model.num_kv_heads // tp if model.num_kv_heads >= tp else 1


def padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def rank_shard(t: Tensor, model: ModelSpec, par: Parallelism) -> tuple[int, int, int]:
    """(out, in, count) of tensor `t` held by one rank."""
    out, inn, cnt = t.out_features, t.in_features, t.count
    if t.split == "col":
        out = -(-out // par.tp)
    elif t.split == "row":
        inn = -(-inn // par.tp)
    elif t.split == "kv_col":
        out = out * kv_heads_per_rank(model, par.tp) // model.num_kv_heads
    elif t.split == "vocab":
        out = -(-padded(out, VOCAB_PADDING) // par.tp)
    elif t.split in ("expert_col", "expert_row"):
        cnt = -(-cnt // par.ep)
        if t.split == "expert_col":
            out = -(-out // par.expert_tp)
        else:
            inn = -(-inn // par.expert_tp)
    return out, inn, cnt
