"""Comm ledger: every collective a rank runs in a training step, with its mesh axis, bytes and time.

Bytes follow the comm-accounting contract (defined here, and costed the same way by cost/comm.py): the FULL
buffer a call operates on (all_reduce: the tensor; reduce_scatter: the whole input; all_gather: the whole output;
send_recv: the tensor sent; all_to_all: the buffer sent), summed per optimizer step. Wire factors are not included.

Three ways in, one record format:
  * code we own calls `ledger.record(axis, collective, nbytes, seconds)` itself (ZeRO, DDP's hook);
  * `ledger.tap()` wraps torch.distributed's collective functions for code we do not own (FSDP2)
    and names each call's axis from its process group (`ledger.name_group`);
  * `Timed` records an async call when its work completes, so time covers the transfer.
"""

import inspect
import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

AXES = ("pp", "dp", "cp", "tp", "ep", "edp", "etp")  # edp: the ranks holding the same expert shards; etp: the
# ranks splitting each expert (specs.layout.expert_mesh_shape)
_active: "CommLedger | None" = None  # the ledger of the running training loop (see `CommLedger.active`)
COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "send_recv", "all_to_all")


class CommLedger:
    def __init__(self):
        self.step = 0
        self.records: list[dict] = []
        self._axis_of_group: dict = {}
        self._tapping = False

    # ---- naming ------------------------------------------------------------------------
    def name_group(self, group, axis: str) -> None:
        """Declare which mesh axis a process group spans (so tapped calls can be attributed)."""
        assert axis in AXES, axis
        self._axis_of_group[group] = axis
        if hasattr(group, "group_name"):  # functional collectives (DTensor) name groups by string
            self._axis_of_group[group.group_name] = axis

    def name_mesh(self, mesh) -> None:
        """Name the group of every dimension of a DeviceMesh with the dimension's name."""
        for axis in mesh.mesh_dim_names:
            if mesh[axis].size() > 1:
                self.name_group(mesh[axis].get_group(), axis)

    def axis_of(self, group) -> str:
        import torch.distributed as dist

        group = group if group is not None else dist.group.WORLD
        if group not in self._axis_of_group:
            raise KeyError(f"collective on a process group the ledger was not told about: {group}")
        return self._axis_of_group[group]

    # ---- recording ---------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        self.step = step

    def record(self, axis: str, collective: str, nbytes: int, seconds: float = 0.0) -> dict:
        assert axis in AXES and collective in COLLECTIVES, (axis, collective)
        entry = {"step": self.step, "axis": axis, "collective": collective, "bytes": int(nbytes),
                 "time_s": seconds}
        self.records.append(entry)
        return entry

    def record_async(self, axis: str, collective: str, nbytes: int, work, start: float) -> None:
        """Record an asynchronous call launched at `start`; its time is filled in when the work
        completes, or is the launch time alone where the backend gives no future (gloo's
        reduce-scatter and all-gather)."""
        entry = self.record(axis, collective, nbytes, time.perf_counter() - start)
        try:
            future = work.get_future()
        except RuntimeError:
            return
        future.then(lambda fut: entry.__setitem__("time_s", time.perf_counter() - start))

    @contextmanager
    def active(self):
        """Make this the ledger that the module-level `record` writes to (code that holds no ledger
        object, e.g. tensor-parallel autograd functions, records through it)."""
        global _active
        previous, _active = _active, self
        try:
            yield self
        finally:
            _active = previous

    # ---- summaries ---------------------------------------------------------------------
    def forget_from(self, step: int) -> None:
        """Drop the records of `step` and later (a rollback runs those steps again)."""
        self.records = [r for r in self.records if r["step"] < step]

    def summary(self, step: int | None = None) -> list[dict]:
        """Per (collective, axis): bytes, calls and seconds of one step (default: the last one)."""
        step = self.step if step is None else step
        acc: dict = defaultdict(lambda: {"bytes": 0, "calls": 0, "time_s": 0.0})
        for r in self.records:
            if r["step"] == step:
                a = acc[(r["collective"], r["axis"])]
                a["bytes"] += r["bytes"]
                a["calls"] += 1
                a["time_s"] += r["time_s"]
        return [{"collective": c, "axis": ax, **v} for (c, ax), v in sorted(acc.items())]

    # ---- tapping torch.distributed ---------------------------------------------------------
    @contextmanager
    def tap(self, functional: bool = False):
        """Record every tensor collective torch.distributed runs inside the block (FSDP2 calls
        `dist.all_gather_single` / `dist.reduce_scatter_single`, or the *_tensor names on older torch).
        functional=True also records torch's functional collectives (DTensor, TP) through a dispatch
        mode, which costs a Python call per operator, so it is off where nothing issues them."""
        import torch.distributed as dist

        if self._tapping:  # nested (one FSDP per pipeline chunk): the outer tap already records
            yield self
            return
        # name -> (collective, the argument whose size is the contract payload)
        specs = {"all_gather_single": ("all_gather", "output_tensor"),
                 "all_gather_into_tensor": ("all_gather", "output_tensor"),
                 "reduce_scatter_single": ("reduce_scatter", "input"),
                 "reduce_scatter_tensor": ("reduce_scatter", "input"),
                 "all_reduce": ("all_reduce", "tensor")}
        saved = {name: getattr(dist, name) for name in specs if hasattr(dist, name)}

        def wrap(name, fn):
            collective, payload = specs[name]
            signature = inspect.signature(fn)

            def tapped(*args, **kwargs):
                bound = signature.bind(*args, **kwargs).arguments
                tensor = bound[payload]
                axis = self.axis_of(bound.get("group"))
                nbytes = tensor.numel() * tensor.element_size()
                start = time.perf_counter()
                work = fn(*args, **kwargs)
                if work is not None:
                    self.record_async(axis, collective, nbytes, work, start)
                else:
                    self.record(axis, collective, nbytes, time.perf_counter() - start)
                return work

            return tapped

        for name, fn in saved.items():
            setattr(dist, name, wrap(name, fn))
        self._tapping = True
        try:
            with (_functional_tap(self) if functional else nullcontext()):
                yield self
        finally:
            self._tapping = False
            for name, fn in saved.items():
                setattr(dist, name, fn)


def _functional_tap(ledger: CommLedger):
    """A dispatch mode recording torch's functional collectives (what DTensor redistributions and
    tensor-parallel layers issue), which never pass through the torch.distributed functions.
    Time is the launch only: these ops complete at a later wait_tensor."""
    import torch
    import torch.distributed._functional_collectives  # noqa: F401 - registers the ops
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = torch.ops._c10d_functional
    # op -> (collective, argument index of the group name, payload bytes from (input, args))
    specs = {
        ops.all_reduce.default: ("all_reduce", 2, lambda t, a: t.numel() * t.element_size()),
        ops.all_gather_into_tensor.default: ("all_gather", 2, lambda t, a: t.numel() * t.element_size() * a[1]),
        ops.reduce_scatter_tensor.default: ("reduce_scatter", 3, lambda t, a: t.numel() * t.element_size()),
        ops.all_to_all_single.default: ("all_to_all", 3, lambda t, a: t.numel() * t.element_size()),
    }

    class FunctionalTap(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            spec = specs.get(func)
            if spec is None:
                return func(*args, **(kwargs or {}))
            collective, group_index, payload = spec
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            ledger.record(ledger.axis_of(args[group_index]), collective, payload(args[0], args),
                          time.perf_counter() - start)
            return out

    return FunctionalTap()


def record(axis: str, collective: str, nbytes: int, seconds: float = 0.0) -> None:
    """Record into the active ledger, if a training loop has one; otherwise a no-op."""
    if _active is not None:
        _active.record(axis, collective, nbytes, seconds)
