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
5. With experts, step 4 fills "partial" layers, whose expert matrices stay in host memory
   (`-ot` rules for the CPU), the last device's first layer being whole. Where all the
   devices' targets together then hold every layer's dense weights, the partial layers are
   made whole again front to back: each device in turn, from the first, takes as many whole
   layers as fit (false position again), then tries one partial layer more keeping its
   attention and up (or also its gate) projections, the rest overflowing to the next device
   (the CPU for the last). The rules printed are llama.cpp's, one per partial layer.

Each trial is planned as llama.cpp's fit measures it, a load without allocations
(plan_gguf's `as_fit_measures`): its compute buffers are the prompt graph's, reserved after
a scheduler reset that forgets llama.cpp's pins, which can make them larger than a load's.
The layer counts are unsigned 32-bit as in common/fit.cpp, whose step 4 can wrap them; the
answer is then still llama.cpp's (tests/test_fit_llama_cpp.py holds one such case).
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
# the FFN matrices a partial layer's rule sends away, by what the layer keeps on its device
# (common/fit.cpp's layer fractions): its attention only, + up, + up and gate, or all but
# its experts; each follows blk\.N
OVERFLOW = {"attn": r"\.ffn_(gate|up|gate_up|down).*", "up": r"\.ffn_(gate|gate_up|down).*",
            "gate": r"\.ffn_down.*", "moe": r"\.ffn_(up|down|gate_up|gate)_(ch|)exps"}
ALL_EXPERTS = r"blk\.\d+" + OVERFLOW["moe"]      # every layer's experts (step 4's test)


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
        """The options as llama-fit-params prints them: -c N -ngl N [-ts A,B,...] (without
        its trailing zeros, when two or more shares are left) [-ot "REGEX=DEVICE,..."] (the
        devices named as llama.cpp names them, where it prints their buffer types' names)."""
        ts = list(self.options.tensor_split or ())
        while ts and ts[-1] == 0:
            ts.pop()
        rules = ",".join(f"{regex}={buft}" for regex, buft in self.options.tensor_overrides)
        return (f"-c {self.options.n_ctx or self.plan.config.n_ctx} "
                f"-ngl {self.options.n_gpu_layers}"
                + (f" -ts {','.join(str(int(x)) for x in ts)}" if len(ts) > 1 else "")
                + (f' -ot "{rules}"' if rules else ""))

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
        """A trial: its plan and each device's bytes, as llama.cpp's fit measures them."""
        nonlocal n_plans
        n_plans += 1
        p = plan_gguf(path, devices, o, as_fit_measures=True)
        return p, [p.device_bytes(d.name) for d in gpus]

    def result(o: PlanOptions, changed: bool, layers: tuple[int, ...] | None = None
               ) -> FitResult:
        """The fit of options `o`, planned as llama.cpp loads them."""
        nonlocal n_plans
        n_plans += 1
        p = plan_gguf(path, devices, o)
        return FitResult(o, p, changed, layers or _layer_counts(p, gpus), tuple(targets),
                         n_plans)

    given, used = plan(opts)
    if all(u <= t for u, t in zip(used, targets)):        # step 1: nothing to change
        return result(opts, False)
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
            return result(opts, True)
    _check_fittable(opts, len(gpus))                      # step 3
    n_layers = given.config.n_layer + 1
    cpu = next(d.name for d in devices if d.is_cpu)

    def with_shares(shares: Sequence[_Share], overflow_to: Sequence[str]) -> PlanOptions:
        return _share_options(opts, shares, overflow_to, n_layers, cpu)

    def memory(shares: Sequence[_Share], overflow_to: Sequence[str] = ()) -> list[int]:
        return plan(with_shares(shares, overflow_to or [cpu] * len(gpus)))[1]

    experts = bool(given.config.n_expert)
    surplus = 0
    if experts:         # do the devices together hold every layer but its experts?
        surplus = sum(targets) - sum(plan(dataclasses.replace(
            opts, tensor_overrides=((ALL_EXPERTS, cpu),)))[1])
    shares, mem = _fill_back_to_front(n_layers, targets, experts, memory)
    overflow_to = [cpu] * len(gpus)
    if experts and surplus > 0:                           # step 5
        names = [d.name for d in gpus]
        shares, overflow_to = _make_whole_front_to_back(shares, mem, targets, names, cpu,
                                                        memory)
    return result(with_shares(shares, overflow_to), True, tuple(s.n_layer for s in shares))


def _shrunk_context(n_min: int, n_max: int, used_min: int, used_max: int, budget: int) -> int:
    """The context between n_min and n_max whose memory, interpolated linearly between
    theirs, is the budget, rounded down to CTX_ALIGN cells."""
    n = n_min + (n_max - n_min) * (budget - used_min) // (used_max - used_min)
    return n - n % CTX_ALIGN


def _check_fittable(opts: PlanOptions, n_gpus: int) -> None:
    """llama.cpp's fit gives up on options the user set, and on row splits over devices."""
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
    if opts.split_mode == "row" and n_gpus > 1:
        raise ArgumentError("--fit with --split-mode row: llama.cpp's fit does not place "
                            "row-split weights; use layer")


U32 = 1 << 32           # common/fit.cpp counts layers in uint32_t, and step 4 can wrap them
MAX_OVERRIDES = 4096    # llama_max_tensor_buft_overrides()


@dataclass(frozen=True)
class _Share:
    """One device's share of the layers (common/fit.cpp's ngl_t): n_layer layers, the last
    n_part of them partial (their experts in host memory); the first partial one keeps
    only `keeps` (an OVERFLOW key) of its FFN, the rest overflowing elsewhere. The counts
    are unsigned 32-bit, as llama.cpp's: its step 4 can take a partial layer from a device
    that has none, and then computes on with the wrapped counts."""
    n_layer: int = 0
    n_part: int = 0
    keeps: str = "moe"

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_layer", self.n_layer % U32)
        object.__setattr__(self, "n_part", self.n_part % U32)

    @property
    def n_full(self) -> int:
        return (self.n_layer - self.n_part) % U32

    def add(self, n_layer: int, n_part: int = 0, keeps: str | None = None) -> _Share:
        return _Share(self.n_layer + n_layer, self.n_part + n_part, keeps or self.keeps)


MemoryOf = Callable[..., list[int]]     # (shares[, overflow devices]) -> bytes per device


def _share_options(opts: PlanOptions, shares: Sequence[_Share], overflow_to: Sequence[str],
                   n_layers: int, cpu: str) -> PlanOptions:
    """The options of `shares` as llama.cpp sets them: -ngl their sum, --tensor-split their
    counts (several devices), a rule per partial layer: the first of a device's sends what
    it does not keep to that device's `overflow_to`, the others their experts to the CPU."""
    n_gpu = (sum(s.n_layer for s in shares) + (1 << 31)) % U32 - (1 << 31)     # an int32
    rules: list[tuple[str, str]] = []
    il0 = (n_layers - n_gpu) % U32
    for share, to in zip(shares, overflow_to):
        il0 = (il0 + share.n_full) % U32
        end = (il0 + share.n_part) % U32
        if end - il0 >= MAX_OVERRIDES - len(rules):
            raise ModelError(f"--fit: llama.cpp's fit would need more than {MAX_OVERRIDES} "
                             "tensor overrides here (its layer counts wrapped) and fails")
        rules += [(rf"blk\.{il}" + OVERFLOW[share.keeps], to) if il == il0 else
                  (rf"blk\.{il}" + OVERFLOW["moe"], cpu) for il in range(il0, end)]
        il0 = end
    return dataclasses.replace(opts, n_gpu_layers=n_gpu, tensor_overrides=tuple(rules),
                               tensor_split=(tuple(float(s.n_layer) for s in shares)
                                             if len(shares) > 1 else None))


def _fill_back_to_front(n_layers: int, targets: Sequence[int], experts: bool,
                        memory: MemoryOf) -> tuple[list[_Share], list[int]]:
    """Layers per device as llama.cpp's fit fills them, the last device first: each takes
    all the unassigned layers if they fit within its target, else the most that do, found
    by false position between a count that fits and one that does not. With `experts` the
    layers are partial (all but the last device's first). Returns the shares and each
    device's bytes with them."""
    nd = len(targets)
    shares = [_Share()] * nd
    mem = memory(shares)
    for dev in reversed(range(nd)):
        n_unassigned = n_layers - sum(s.n_layer for s in shares[dev + 1:])
        if n_unassigned == 0:
            continue
        high = list(shares)
        high[dev] = _Share(n_unassigned, (n_unassigned - (dev == nd - 1)) * experts)
        mem_high = memory(high)
        if mem_high[dev] <= targets[dev]:
            shares, mem = high, mem_high
            continue
        while high[dev].n_layer - shares[dev].n_layer > 1:
            delta = high[dev].n_layer - shares[dev].n_layer
            step = _c_step(delta, targets[dev] - mem[dev], mem_high[dev] - mem[dev])
            whole_first = dev == nd - 1 and shares[dev].n_part == 0    # the output layer's
            trial = list(shares)
            trial[dev] = shares[dev].add(step, (step - whole_first) * experts)
            mem_trial = memory(trial)
            if mem_trial[dev] <= targets[dev]:
                shares, mem = trial, mem_trial
            else:
                high, mem_high = trial, mem_trial
    return shares, mem


def _make_whole_front_to_back(shares: list[_Share], mem: list[int], targets: Sequence[int],
                              names: Sequence[str], cpu: str, memory: MemoryOf
                              ) -> tuple[list[_Share], list[str]]:
    """llama.cpp's step 4 for models with experts whose dense weights all fit: each device
    from the first takes the partial layers of the devices from the first with layers on,
    made whole, as many as fit (false position on the whole layers), then tries one partial
    layer more keeping its attention and up (then gate) projections, or only its
    attention, overflowing the rest to the next device. Returns the shares and each
    device's overflow device."""
    nd = len(shares)
    overflow_to = [cpu] * nd
    dense_start = nd                        # the first of the last devices with layers
    while dense_start > 0 and shares[dense_start - 1].n_layer > 0:
        dense_start -= 1
    dev = 0
    while dev <= dense_start < nd:
        high = list(shares)
        for jd in range(dense_start, nd):    # all of them whole, the output layer staying
            move = (high[jd].n_layer - (jd == nd - 1)) % U32
            high[dev] = high[dev].add(move)
            high[jd] = _Share(high[jd].n_layer - move, 0, high[jd].keeps)
        mem_high = memory(high, overflow_to)
        if mem_high[dev] <= targets[dev]:
            shares, mem, dense_start = high, mem_high, nd - 1
        while (high[dev].n_full - shares[dev].n_full) % U32 > 1:
            delta = (high[dev].n_full - shares[dev].n_full) % U32
            step = _c_step(delta, targets[dev] - mem[dev], mem_high[dev] - mem[dev])
            trial, start, converted = list(shares), dense_start, 0
            while start < nd:                # the first `step` partial layers made whole
                n = min(step - converted, trial[start].n_part)
                trial[start] = trial[start].add(-n, -n)
                trial[dev] = trial[dev].add(n)
                converted += n
                if trial[start].n_part > 0:
                    break
                start += 1
            mem_trial = memory(trial, overflow_to)
            if mem_trial[dev] <= targets[dev]:
                shares, mem, dense_start = trial, mem_trial, start
            else:
                high, mem_high = trial, mem_trial
        if dense_start < nd and shares[dense_start].n_layer > (dev == nd - 1):
            shares, mem, dense_start, overflow_to = _one_partial_layer_more(
                shares, mem, dense_start, overflow_to, dev, targets, names, memory)
        dev += 1
    return shares, overflow_to


def _one_partial_layer_more(shares: list[_Share], mem: list[int], dense_start: int,
                            overflow_to: list[str], dev: int, targets: Sequence[int],
                            names: Sequence[str], memory: MemoryOf
                            ) -> tuple[list[_Share], list[int], int, list[str]]:
    """Step 4's last try for device `dev`: the first partial layer of the dense devices
    moves to it keeping attention and up, then also gate, else attention alone, its other
    FFN matrices on the next device (the CPU after the last); each kept where both devices
    stay strictly under their targets."""
    nd = len(shares)
    trial = list(shares)
    trial[dense_start] = trial[dense_start].add(-1, -1)
    trial[dev] = trial[dev].add(1, 1)
    start = dense_start + (trial[dense_start].n_part == 0)
    trial_to = list(overflow_to)
    if dev < nd - 1:
        trial_to[dev] = names[dev + 1]
    kept = (shares, mem, dense_start, overflow_to)

    def keeping(keeps: str) -> bool:
        nonlocal kept, trial
        trial = list(trial)
        trial[dev] = dataclasses.replace(trial[dev], keeps=keeps)
        mem_trial = memory(trial, trial_to)
        fits = mem_trial[dev] < targets[dev] and (dev + 1 == nd or
                                                  mem_trial[dev + 1] < targets[dev + 1])
        if fits:
            kept = (trial, mem_trial, start, trial_to)
        return fits

    if keeping("up"):
        keeping("gate")
    else:
        keeping("attn")
    return kept


def _layer_counts(plan: ModelPlan, gpus: Sequence[Device]) -> tuple[int, ...]:
    """Each device's layers in `plan`, the output layer included."""
    placed = [*plan.layer_devices, plan.output_device]
    return tuple(placed.count(d.name) for d in gpus)


__all__ = ["DEFAULT_MARGIN_MIB", "DEFAULT_MIN_CTX", "FitResult", "fit_gguf", "margins_of"]
