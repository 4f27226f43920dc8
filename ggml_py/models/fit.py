"""`--fit`: the placement llama.cpp's `--fit on` / `llama-fit-params` (common/fit.cpp) would
choose for the devices' memories, found by planning (models.model_plan) instead of loading.

llama.cpp's rule, as ported here:
1. Plan the options as given. Where every device keeps at least its margin (`--fit-target`,
   MiB per device, 1024 by default) free, nothing changes.
2. Where the devices together lack memory and `-c 0` asks for the file's context, the
   context shrinks: linearly between the file's and `--fit-ctx` (4096 by default) by the
   memory of both, rounded down to 256 cells; with several devices the budget keeps half a
   layer (a sixth with experts) per device, and one more, spare for whole-layer waste.
   With one device that is the fit; with several, the layers are fitted at that context.
3. Otherwise only options the user left at their defaults are changed: -ngl, --tensor-split
   and the tensor overrides (any of them set: the fit gives up, as llama.cpp's does).
4. The devices are filled back to front: the last device first takes as many of the
   n_layer + 1 layers (the output layer counting as the last) as keep its memory within
   its target (free memory less its margin), then the device before it from what is left,
   and so on. Each device's count is searched by false position between the count that
   fits and the one that does not, as llama.cpp does, each trial a plan. The result is
   `-ngl` (the sum) and `--tensor-split` (the counts, with several devices).

Not ported yet: the partial layers of models with experts (llama.cpp's step 4 for
them), refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ggml_py.errors import ArgumentError, ModelError
from ggml_py.models.devices import Device
from ggml_py.models.gguf import read_tensor_infos
from ggml_py.models.model_plan import ModelPlan, PlanOptions, plan_gguf

MIB = 1 << 20
DEFAULT_MARGIN_MIB = 1024       # common's --fit-target default
DEFAULT_MIN_CTX = 4096          # common's --fit-ctx default
CTX_ALIGN = 256                 # llama.cpp rounds a shrunk context down to this


@dataclass
class FitResult:
    """The options --fit chose and their plan."""
    options: PlanOptions
    plan: ModelPlan
    changed: bool                       # False: the options as given already fit
    layers: tuple[int, ...]             # layers per device (the output layer included)
    targets: tuple[int, ...]            # bytes each device may use (free less margin)
    n_plans: int                        # plans made to find it

    def args(self) -> str:
        """The options as llama-fit-params prints them: -c N -ngl N [-ts A,B,...]."""
        ts = self.options.tensor_split
        return (f"-c {self.options.n_ctx or self.plan.config.n_ctx} "
                f"-ngl {self.options.n_gpu_layers}"
                + (f" -ts {','.join(str(int(x)) for x in ts)}" if ts else ""))

    def _used(self) -> list[tuple[Device, int]]:
        return [(d, self.plan.device_bytes(d.name)) for d in self.plan.devices if not d.is_cpu]

    def to_dict(self) -> dict[str, Any]:
        """The --json report's "fit" object."""
        return {"args": self.args(), "changed": self.changed,
                "n_gpu_layers": self.options.n_gpu_layers,
                "tensor_split": list(self.options.tensor_split or ()),
                "devices": [{"name": d.name, "layers": n, "used": used, "target": target}
                            for (d, used), n, target in zip(self._used(), self.layers,
                                                            self.targets)],
                "n_plans": self.n_plans}

    def text(self) -> str:
        """The fit in words: the options, then each device's layers and memory in MiB."""
        lines = [f"fit: {self.args()}" + ("" if self.changed else " (fits as given)")]
        for (d, used), n, target in zip(self._used(), self.layers, self.targets):
            lines.append(f"  {d.name:<8} {n:3d} layers, {used / MIB:9.2f} MiB used of "
                         f"{target / MIB:9.2f} MiB (free less margin)")
        return "\n".join(lines)


def margins_of(margins_mib: Sequence[int], n_devices: int) -> list[int]:
    """--fit-target's values in bytes per device: one value is every device's."""
    if any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in margins_mib):
        raise ArgumentError(f"--fit-target takes MiB counts >= 0, got {list(margins_mib)}")
    if len(margins_mib) == 1:
        return [margins_mib[0] * MIB] * n_devices
    if len(margins_mib) != n_devices:
        raise ArgumentError(f"--fit-target has {len(margins_mib)} values for {n_devices} "
                            "devices (give one, or one per device)")
    return [m * MIB for m in margins_mib]


def _c_step(delta: int, room: int, span: int) -> int:
    """llama.cpp's false-position step: delta * room / span in int64 (truncated), stored
    in a uint32 (a negative room wraps to a huge step), then kept within 1..delta-1."""
    q = abs(delta * room) // abs(span) if span else 0
    q = q if (delta * room >= 0) == (span >= 0) else -q
    return min(max(q % (1 << 32), 1), delta - 1)


def fit_gguf(path: str, devices: Sequence[Device], options: PlanOptions | None = None,
             margins_mib: Sequence[int] = (DEFAULT_MARGIN_MIB,),
             n_ctx_min: int = DEFAULT_MIN_CTX) -> FitResult:
    """The options llama.cpp's --fit would choose from `options` for the GGUF file at
    `path` on `devices` (each device besides the CPU with its memory), and their plan;
    `n_ctx_min` (--fit-ctx): the least context a shrink of `-c 0`'s may leave."""
    opts = options or PlanOptions()
    if isinstance(n_ctx_min, bool) or not isinstance(n_ctx_min, int) or n_ctx_min < 1:
        raise ArgumentError(f"--fit-ctx must be a positive integer, got {n_ctx_min!r}")
    n_ctx_auto = opts.n_ctx == 0                # resolved to the file's before any plan
    if n_ctx_auto:
        opts = dataclasses.replace(opts, n_ctx=read_tensor_infos(path)[0].n_ctx)
    gpus = [d for d in devices if not d.is_cpu]
    unsized = [d.name for d in gpus if d.memory is None]
    if unsized:
        raise ArgumentError(f"--fit needs each device's memory, e.g. rpc:24105MiB; "
                            f"{', '.join(unsized)} has none")
    targets = [d.memory - m for d, m in zip(gpus, margins_of(margins_mib, len(gpus)))
               if d.memory is not None]
    n_plans = 0

    def plan(o: PlanOptions) -> tuple[ModelPlan, list[int]]:
        nonlocal n_plans
        n_plans += 1
        p = plan_gguf(path, devices, o)
        return p, [p.device_bytes(d.name) for d in gpus]

    given, used = plan(opts)
    if all(u <= t for u, t in zip(used, targets)):        # step 1: nothing to change
        return FitResult(opts, given, False, _layer_counts(given, gpus), tuple(targets),
                         n_plans)
    # step 2: the devices together lack memory: shrink -c 0's context
    if n_ctx_auto and sum(used) > sum(targets) and opts.n_ctx > n_ctx_min:
        budget = sum(targets)
        if len(gpus) > 1:       # whole layers (or expert tensors, a third of one) waste
            model = sum(b.bytes for b in given.buffers if b.kind == "model" and
                        b.device in {d.name for d in gpus})      # about half one per device
            per_layer = model // given.config.n_layer
            budget -= (len(gpus) + 1) * per_layer // (6 if given.config.n_expert else 2)
        least = dataclasses.replace(opts, n_ctx=n_ctx_min)
        used_least = sum(plan(least)[1])
        opts = least if budget <= used_least else dataclasses.replace(opts, n_ctx=max(
            _shrunk_context(n_ctx_min, opts.n_ctx, used_least, sum(used), budget), n_ctx_min))
        if len(gpus) <= 1 and budget > used_least:
            shrunk = plan(opts)[0]
            return FitResult(opts, shrunk, True, _layer_counts(shrunk, gpus), tuple(targets),
                             n_plans)
    _check_fittable(opts, given)                          # step 3

    def with_layers(counts: Sequence[int]) -> PlanOptions:
        return dataclasses.replace(opts, n_gpu_layers=sum(counts), tensor_split=(
            tuple(float(n) for n in counts) if len(counts) > 1 else None))

    # step 4: the layers, back to front
    counts = _fill_back_to_front(given.config.n_layer + 1, targets,
                                 lambda c: plan(with_layers(c))[1])
    chosen = with_layers(counts)
    return FitResult(chosen, plan(chosen)[0], True, tuple(counts), tuple(targets), n_plans)


def _shrunk_context(n_min: int, n_max: int, used_min: int, used_max: int, budget: int) -> int:
    """The context between n_min and n_max whose memory, interpolated linearly between
    theirs, is the budget, rounded down to CTX_ALIGN cells."""
    n = n_min + (n_max - n_min) * (budget - used_min) // (used_max - used_min)
    return n - n % CTX_ALIGN


def _check_fittable(opts: PlanOptions, given: ModelPlan) -> None:
    """llama.cpp's fit gives up on options the user set, and (here) on what is not ported."""
    if opts.n_gpu_layers != PlanOptions.n_gpu_layers:
        raise ArgumentError(f"--fit: -ngl {opts.n_gpu_layers} is set and does not fit; "
                            "llama.cpp's fit changes only an unset -ngl")
    if opts.tensor_split is not None and any(opts.tensor_split):
        raise ArgumentError("--fit: --tensor-split is set and does not fit; llama.cpp's fit "
                            "changes only an unset --tensor-split")
    if opts.tensor_overrides:
        raise ArgumentError("--fit: tensor overrides (-ot, --cpu-moe, --n-cpu-moe) are set "
                            "and do not fit; llama.cpp's fit changes only unset ones")
    if opts.split_mode == "none":
        raise ArgumentError("--fit with --split-mode none: the model uses one device, "
                            "whose layers llama.cpp's fit does not place; use layer")
    if given.config.n_expert:
        raise ModelError(f"--fit for {given.path}: models with experts are fitted with "
                         "partial layers, not planned yet")


def _fill_back_to_front(n_layers: int, targets: Sequence[int],
                        memory: Callable[[Sequence[int]], list[int]]) -> list[int]:
    """Layers per device as llama.cpp's fit fills them, the last device first: each takes
    all the unassigned layers if they fit within its target, else the most that do, found
    by false position between a count that fits and one that does not. `memory(counts)`:
    each device's bytes with those counts."""
    counts = [0] * len(targets)
    mem = memory(counts)
    for dev in reversed(range(len(targets))):
        high = list(counts)
        high[dev] = n_layers - sum(counts[dev + 1:])
        if high[dev] == 0:
            continue
        mem_high = memory(high)
        if mem_high[dev] <= targets[dev]:
            counts, mem = high, mem_high
            continue
        while high[dev] - counts[dev] > 1:
            delta = high[dev] - counts[dev]
            trial = list(counts)
            trial[dev] += _c_step(delta, targets[dev] - mem[dev], mem_high[dev] - mem[dev])
            mem_trial = memory(trial)
            if mem_trial[dev] <= targets[dev]:
                counts, mem = trial, mem_trial
            else:
                high, mem_high = trial, mem_trial
    return counts


def _layer_counts(plan: ModelPlan, gpus: Sequence[Device]) -> tuple[int, ...]:
    """Each device's layers in `plan`, the output layer included."""
    placed = [*plan.layer_devices, plan.output_device]
    return tuple(placed.count(d.name) for d in gpus)


__all__ = ["DEFAULT_MARGIN_MIB", "DEFAULT_MIN_CTX", "FitResult", "fit_gguf", "margins_of"]
