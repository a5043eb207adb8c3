"""Cross-replica check for silent data corruption: tensors that several ranks hold as copies must stay equal
bit for bit, so a difference names a corrupted rank and tensor.

Replicas checked, as the data-parallel strategies name them (Strategy.replicas): the parameters of the
data-parallel replicas (the dp x cp ranks) under zero 0-2 (routed experts within their expert data-parallel
group) (and their optimizer state under zero=0, where it is replicated too), under zero=3 with hybrid sharding
the shards and optimizer state of the replica groups; and the norm weights every tensor-parallel rank holds
whole (and their optimizer state under zero 0 and 3). Under zero 1-2 a rank's parameters are re-gathered from
their owners' shards every step, so a flip in a gathered copy lives one step, and a flip in an owner's shard is
gathered into every replica alike: only the numerical guards can see that one.

Each tensor's fingerprint is the int64 sum of its bits read as int32 (bytes for other widths): one bit flip
changes it by a power of two, never by zero. The fingerprints travel in one small all-gather per replica
group; with more than two replicas the majority names the odd one, with two both are named.
"""

from collections import Counter

import torch
import torch.distributed as dist

from meshscale.parallel.strategy import local_part
from meshscale.parallel.tensor import is_tp_replicated
from meshscale.runtime.resilience.guards import Anomaly


def fingerprint(t: torch.Tensor) -> torch.Tensor:
    flat = local_part(t.detach()).contiguous().reshape(-1)
    bits = flat.view(torch.int32) if flat.element_size() == 4 else flat.view(torch.uint8)
    return bits.sum(dtype=torch.int64)


def outliers(values: list) -> list[int]:
    """Indices of the values that differ: those off the strict majority, or all of them without one."""
    counts = Counter(values)
    if len(counts) == 1:
        return []
    common, n = counts.most_common(1)[0]
    if n * 2 > len(values):
        return [i for i, v in enumerate(values) if v != common]
    return list(range(len(values)))


class ReplicaCheck:
    def __init__(self, par, optimizer: torch.optim.Optimizer, rollback: bool = False):
        self.optimizer, layout, mesh = optimizer, par.layout, par.mesh
        self.action = "rollback" if rollback else "stop"  # a corrupted replica is repaired only by a checkpoint
        named = [(name, p) for s in par.strategies for name, p in s.module.named_parameters()]
        self.device = named[0][1].device
        self.groups = []  # (axis, process group, [(name, param)], whether its optimizer state is a replica too)
        for axis, group, params, with_state in (r for s in par.strategies for r in s.replicas()):
            same = next((g for g in self.groups if g[1] is group and g[0] == axis), None)
            if same:  # another pipeline chunk's parameters over the same replicas: one gather for them all
                same[2].extend(params)
            else:
                self.groups.append((axis, group, list(params), with_state))
        if layout.tp > 1:
            replicated = [(name, p) for name, p in named if is_tp_replicated(name)]
            self.groups.append(("tp", mesh["tp"].get_group(), replicated, layout.zero in (0, 3)))

    def tensors(self, named: list, with_state: bool) -> list:
        """The (name, tensor) pairs one replica group compares: parameters, and their optimizer state."""
        out = []
        for name, p in named:
            out.append((name, p))
            if with_state:
                state = self.optimizer.state.get(p, {})
                out += [(f"{name} ({key})", v) for key, v in sorted(state.items()) if isinstance(v, torch.Tensor)]
        return out

    def run(self, step: int) -> Anomaly | None:
        """Compare every replica group's fingerprints; collective over every rank (same answer everywhere)."""
        findings = []  # (tensor name, axis, ranks that differ)
        for axis, group, named, with_state in self.groups:
            tensors = self.tensors(named, with_state)
            mine = torch.stack([fingerprint(t) for _, t in tensors])
            gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
            dist.all_gather(gathered, mine, group=group)
            members = dist.get_process_group_ranks(group)
            if dist.get_rank() == members[0]:  # one report per group
                table = torch.stack(gathered).tolist()
                findings += [(name, axis, [members[i] for i in odd]) for j, (name, _) in enumerate(tensors)
                             if (odd := outliers([row[j] for row in table]))]
        count = torch.tensor([len(findings)], device=self.device)  # on the device: NCCL reduces only those
        dist.all_reduce(count)
        if not count.item():
            return None
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, findings)
        return _anomaly(step, [f for fs in everyone for f in fs], self.action)


def _anomaly(step: int, findings: list, action: str) -> Anomaly:
    """Name, per differing tensor, the ranks blamed by the most checks: the odd one of a majority, or the
    copy that differs in both its dp and tp groups; two copies that merely differ are both named."""
    lines, blamed = [], set()
    for name in sorted({f[0] for f in findings}):
        score = Counter(r for n, _, odd in findings if n == name for r in odd)
        top = max(score.values())
        suspects = sorted(r for r, c in score.items() if c == top)
        axes = "/".join(sorted({axis for n, axis, _ in findings if n == name}))
        blamed.update(suspects)
        if len(suspects) == 1:
            lines.append(f"{name} on rank {suspects[0]} differs from its {axes} replicas")
        else:
            lines.append(f"{name} differs between its {axes} replicas on ranks {', '.join(map(str, suspects))} "
                         "(no majority: either may be the corrupted one)")
    shown = "; ".join(lines[:3]) + (f"; and {len(lines) - 3} more" if len(lines) > 3 else "")
    return Anomaly(step, "sdc", f"step {step}: silent data corruption: {shown}", sorted(blamed), action)
