"""The tools built on the library: the command line and what it runs.

    commands.py   `ggml-py` / `python -m ggml_py`: demo, run, plan, bench, ops-check
    cli.py        argument parsing, checks and exit statuses shared by the commands
    demo.py       models through the scheduler on the backends at hand
    run.py        `ggml-py run MODEL.gguf`: a GGUF model's tokens and pp / tg tokens/s
    opscheck.py   ggml's op and model cases on a backend, against ggml's results
    cases.py      scheduling case files (SCHED_CASES.md): load, save, rebuild
    planning.py   plans of case files, explanations, split timing
    dot.py        Graphviz pictures of split graphs
    splitmap.py   split maps: where each node ran and what each split cost
    machine.py    what machine a benchmark ran on (printed before its numbers)

Nothing in the library (ggml_py's core, backends, allocator, scheduler, runtime and
models) imports from here.
"""
