"""`ggml-py plan MODEL.gguf`: llama.cpp's placement options on the command line, and the
plan of the model (models.model_plan) in words or as JSON.

The options keep llama.cpp's names and meanings (-ngl, --split-mode, --tensor-split,
--main-gpu, -ot/--override-tensor, --cpu-moe, --n-cpu-moe, -c, -b, -ub, --cache-type-k/-v,
--no-kv-offload, --no-op-offload, -fa);
`--fit on` (with `--fit-target`, `--fit-ctx`) chooses -c 0's context, -ngl and
--tensor-split as llama.cpp's fit would (models.fit);
`--device` says what to plan on: `cuda0:24GiB,cuda1:24GiB,cpu:64GiB` or
`rpc:24105MiB,rpc:24105MiB,cpu` (simulated devices of the kinds cuda, metal, vulkan,
opencl, rpc and cpu with that much free memory, named CUDA0, CUDA1, ..., RPC0, ..., CPU as
llama.cpp names them; or `rpc:HOST:PORT`, a live server's devices with the memory it
reports); `--map`
draws the split maps of the decode token and the prompt ubatch.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any, Sequence

from ggml_py.tools import cli


def gpu_layers(text: str) -> int:
    """-ngl: a layer count, or 'all' (-1: every layer and the output)."""
    if text == "all":
        return -1
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a layer count or 'all'") from None
    if n < -1:
        raise argparse.ArgumentTypeError(f"must be -1 (all), 0 or more, got {n}")
    return n


def fit_targets(text: str) -> tuple[int, ...]:
    """--fit-target's value: MiB per device, comma-separated (one value: every device's)."""
    return tuple(cli.count(0)(x) for x in text.split(","))


def override_rules(text: str) -> tuple[tuple[str, str], ...]:
    """-ot's value: REGEX=BUFFER_TYPE rules, comma-separated."""
    from ggml_py.errors import ArgumentError
    from ggml_py.models.model_plan import parse_overrides
    try:
        return parse_overrides(text)
    except ArgumentError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def n_cpu_moe_rules(text: str) -> tuple[tuple[str, str], ...]:
    """--n-cpu-moe N's rules: the experts of layers 0..N-1 on the CPU."""
    from ggml_py.models.model_plan import cpu_moe_overrides
    return cpu_moe_overrides(cli.count(0)(text))


class AddOverrides(argparse.Action):
    """-ot, --cpu-moe and --n-cpu-moe add their rules to one list in command-line order, as
    llama.cpp's common does (the first rule a weight's name matches places it)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        rules: Sequence[tuple[str, str]] = self.const if self.nargs == 0 else values
        setattr(namespace, self.dest, (*(getattr(namespace, self.dest) or ()), *rules))


def add_arguments(p: argparse.ArgumentParser) -> dict[str, tuple[object, str]]:
    """Add the model options of `plan` (defaults: llama.cpp's common ones); returns
    {dest: (default, the options' names)} of them."""
    from ggml_py.models.fit import DEFAULT_MARGIN_MIB, DEFAULT_MIN_CTX
    from ggml_py.models.model_plan import (CACHE_TYPES, FLASH_ATTN, SPLIT_MODES, PlanOptions,
                                           cpu_moe_overrides)
    d = PlanOptions()
    g = p.add_argument_group("a model file (MODEL.gguf): llama.cpp's options")
    g.add_argument("--device", default="cpu", metavar="KIND[:MEMORY],...",
                   help="the devices to plan on, e.g. cuda0:24GiB,cuda1:24GiB,cpu:64GiB "
                        "(kinds: cuda, metal, vulkan, opencl, rpc, cpu; the CPU is always "
                        "there; default: cpu); "
                        "rpc:HOST:PORT asks a live ggml RPC server for its free memory")
    g.add_argument("-ngl", "--n-gpu-layers", type=gpu_layers, default=d.n_gpu_layers,
                   metavar="N", help="layers on the devices, the output layer counting as "
                                     "the last (default: all)")
    g.add_argument("-sm", "--split-mode", choices=SPLIT_MODES, default=d.split_mode,
                   help="layer: layers over the devices; none: all on --main-gpu")
    g.add_argument("-ts", "--tensor-split", type=cli.shares, metavar="A,B,...",
                   help="each device's share of the layers (default: by free memory)")
    g.add_argument("-mg", "--main-gpu", type=cli.count(0), default=d.main_gpu, metavar="I",
                   help="the device of --split-mode none (default 0)")
    g.add_argument("-ot", "--override-tensor", dest="tensor_overrides", action=AddOverrides,
                   type=override_rules, metavar="REGEX=DEVICE,...",
                   help="weights whose names the (Python) regex finds go to DEVICE (RPC0, "
                        "CPU, ...); the first matching rule wins, e.g. "
                        r"'blk\.[0-3]\.ffn_.*_exps\.=CPU'")
    g.add_argument("-cmoe", "--cpu-moe", dest="tensor_overrides", action=AddOverrides, nargs=0,
                   const=cpu_moe_overrides(), help="every expert weight on the CPU")
    g.add_argument("-ncmoe", "--n-cpu-moe", dest="tensor_overrides", action=AddOverrides,
                   type=n_cpu_moe_rules, metavar="N",
                   help="the expert weights of the first N layers on the CPU")
    g.add_argument("-c", "--ctx-size", dest="n_ctx", type=cli.count(0), default=d.n_ctx,
                   metavar="N", help="KV cache cells, 0: the file's (default %(default)s)")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=cli.count(), default=d.n_batch,
                   metavar="N", help="logical batch (default %(default)s)")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=cli.count(),
                   default=d.n_ubatch, metavar="N", help="physical batch (default %(default)s)")
    for kv in ("k", "v"):
        g.add_argument(f"-ct{kv}", f"--cache-type-{kv}", choices=CACHE_TYPES, default="f16",
                       help=f"the {kv.upper()} cache's type (default f16)")
    g.add_argument("-nkvo", "--no-kv-offload", action="store_true",
                   help="keep the KV cache and attention on the CPU")
    g.add_argument("--no-op-offload", action="store_true",
                   help="no offload of host-weight ops to the devices")
    g.add_argument("-fa", "--flash-attn", choices=FLASH_ATTN, default=d.flash_attn,
                   help="flash attention (default auto: on where every layer's device runs "
                        "it)")
    g.add_argument("--no-mmap", action="store_true",
                   help="CPU weights in a CPU buffer, not the mapped file")
    g.add_argument("-fit", "--fit", choices=("on", "off"), default="off",
                   help="choose the unset -ngl and --tensor-split as llama.cpp's --fit on "
                        "would for the devices' memories (default off: plan as given)")
    g.add_argument("-fitt", "--fit-target", type=fit_targets, default=(DEFAULT_MARGIN_MIB,),
                   metavar="MiB0,MiB1,...", help="memory --fit leaves free on each device "
                   f"(one value: every device's; default {DEFAULT_MARGIN_MIB})")
    g.add_argument("-fitc", "--fit-ctx", type=cli.count(), default=DEFAULT_MIN_CTX,
                   metavar="N", help="the least context --fit may shrink -c 0's to "
                                     "(default %(default)s)")
    g.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    return {a.dest: (a.default, "/".join(o for b in g._group_actions if b.dest == a.dest
                                         for o in b.option_strings if o.startswith("--")))
            for a in g._group_actions}


def check_case_arguments(args: argparse.Namespace) -> None:
    """A UsageError for a model option given with a case file."""
    given = [names for k, (default, names) in args.model_defaults.items()
             if getattr(args, k) != default]
    if given:
        raise cli.UsageError(f"{given[0]} applies to a model file (MODEL.gguf), not to a "
                             f"case file")


def run(args: argparse.Namespace) -> int:
    """Plan args.case (a GGUF file) and print the plan."""
    from ggml_py.errors import ArgumentError
    from ggml_py.models.devices import parse_devices
    from ggml_py.models.fit import fit_gguf
    from ggml_py.models.model_plan import PlanOptions, plan_gguf
    for opt in ("output", "dot"):
        if getattr(args, opt):
            raise cli.UsageError(f"--{opt} applies to a case file, not to a model file")
    if args.alloc:
        raise cli.UsageError("--alloc applies to a case file, not to a model file")
    options = PlanOptions(
        n_gpu_layers=args.n_gpu_layers, split_mode=args.split_mode,
        tensor_split=tuple(args.tensor_split) if args.tensor_split else None,
        main_gpu=args.main_gpu, n_ctx=args.n_ctx, n_batch=args.n_batch,
        n_ubatch=args.n_ubatch, cache_type_k=args.cache_type_k,
        cache_type_v=args.cache_type_v, kv_offload=not args.no_kv_offload,
        op_offload=not args.no_op_offload, flash_attn=args.flash_attn,
        use_mmap=not args.no_mmap, tensor_overrides=args.tensor_overrides or ())
    try:
        devices = parse_devices(args.device)
        fit = (None if args.fit == "off" else
               fit_gguf(args.case, devices, options, args.fit_target, args.fit_ctx))
        plan = fit.plan if fit else plan_gguf(args.case, devices, options)
    except ArgumentError as e:
        raise cli.UsageError(str(e)) from None
    if args.json:
        print(json.dumps({**plan.to_dict(), **({"fit": fit.to_dict()} if fit else {})}))
    else:
        print(f"{fit.text()}\n{plan.text()}" if fit else plan.text())
    if args.map:
        from ggml_py.tools.splitmap import SplitMap
        for graph, path in enumerate(map_paths(args.map)):
            SplitMap.from_model_plan(plan, graph).save(path)
    return 0


def map_paths(path: str) -> tuple[str, str]:
    """The files of --map FILE for a model: (the prompt ubatch's, FILE-prompt.EXT; the
    decode token's, FILE)."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-prompt{ext}", path
