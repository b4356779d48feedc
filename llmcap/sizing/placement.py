"""Where a pool's instances sit on nodes, and how many one node loss takes down.

Rule (deterministic): each pool gets its own nodes (roles are not mixed on a node, so a node loss hits
one pool). An instance of g GPUs on n-GPU nodes:
- g ≤ n: a node holds at most ⌊n/g⌋ instances (instances do not span nodes; n mod g GPUs stay free).
  Packed: nodes are filled in order to c = ⌊n/g⌋ instances, the remainder on the last — except that,
  when node losses are planned for, c ≤ ⌈N/2⌉: a pool smaller than two full nodes splits over two, so
  one loss never takes all of a small pool. (N − c then never falls as N grows.)
- g > n: an instance spans ⌈g/n⌉ whole nodes; a lost node kills the one instance on it.
Losing `k` nodes loses the instances of the k fullest nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    instances: int
    gpus_per_instance: int
    gpus_per_node: int
    per_node: tuple[int, ...]  # instances on each node, fullest first; an instance spanning nodes counts on each

    @property
    def spans_nodes(self) -> bool:
        return self.gpus_per_instance > self.gpus_per_node

    @property
    def nodes(self) -> int:
        return len(self.per_node)

    def lost(self, node_failures: int) -> int:
        """Instances down when the `node_failures` fullest nodes are lost."""
        if self.spans_nodes:
            return min(node_failures, self.instances)
        return sum(self.per_node[:node_failures])

    def describe(self) -> str:
        g, n = self.gpus_per_instance, self.gpus_per_node
        if self.spans_nodes:
            return f"{self.instances} instance(s) of {g} GPUs each span ceil({g}/{n}) = {math.ceil(g / n)} nodes"
        counts = "+".join(str(c) for c in self.per_node) or "0"
        return f"{self.instances} instance(s) of {g} GPUs on {self.nodes} {n}-GPU node(s) ({n} // {g} = {n // g} max per node): {counts}"


def place(instances: int, gpus_per_instance: int, gpus_per_node: int, spread: bool = True) -> Placement:
    """The module docstring's rule; `spread`: node losses are planned for (no more than half a pool per node)."""
    g, n = gpus_per_instance, gpus_per_node
    if instances <= 0:
        return Placement(0, g, n, ())
    if g > n:
        return Placement(instances, g, n, (1,) * (instances * math.ceil(g / n)))
    cap = n // g
    c = min(cap, math.ceil(instances / 2)) if spread and instances >= 2 else min(cap, instances)
    full, rest = divmod(instances, c)
    return Placement(instances, g, n, (c,) * full + ((rest,) if rest else ()))
