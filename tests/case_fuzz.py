"""A mutation fuzzer of case files (run by test_robust_cases.py, or by hand).

Each round takes a case of tests/data/cases, mutates it -- any field to a value of
another kind or past a C limit, the graph's order, references, views, buffers, the
backends; or the file's bytes (truncated, not UTF-8, UTF-16, nested deeply) -- and
runs it as the command line does: load_case, a scheduler with the case's settings,
alloc_graph, the plan with its alloc block, and a soundness proof of the allocation.
Every round must end in a plan or a GgmlPyError, within seconds; an unsound
allocation counts as a wrong result.

    python tests/case_fuzz.py [--seed S] [--rounds N] [--seconds T] [--max-nodes M]
                              [--outcomes]

prints `round K seed S` before each round (the parent names the round that killed
the process), one `PROBLEM {json}` line per bad round and a `SUMMARY {json}` line.

With --outcomes it also prints what each round decided, `outcome K plan SHA1` (of the
plan JSON with its alloc block) or `outcome K ErrorClass kind message`: the same seed
run under two builds of ggml_py must print the same outcome lines wherever the change
between them should not change what the scheduler decides (a differential test of a
rework: `diff <(grep ^outcome A.log) <(grep ^outcome B.log)`).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import random
import re
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "data", "cases")
ROUND_TIMEOUT_S = 20

INTS = [0, 1, -1, 2, 3, 31, 32, 33, 64, 4096, 2**31 - 1, 2**31, 2**32, 2**56, 2**56 + 1,
        2**62, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), 10**30, 2**4000]
STRINGS = ["", "x" * 64, "x" * 63, "\ud800", "na\u00efve", "NONE", "VIEW", "MUL_MAT", "f32",
           "q8_0", "CPU", "GPU0", "INPUT", "weights", "*", "\x00"]
OTHER = [None, True, False, 1.5, float("nan"), float("inf"), [], [None], {}, {"a": 1}]


class Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise Timeout()


def base_cases(max_nodes):
    out = []
    for sub in ("", "random", "aborts"):
        d = os.path.join(CASES, sub)
        for f in sorted(os.listdir(d)):
            if f.endswith(".case.json"):
                with open(os.path.join(d, f)) as fh:
                    case = json.load(fh)
                if len(case["nodes"]) <= max_nodes:
                    out.append((f, case))
    return out


# ---------------------------------------------------------------------------
# mutations of the document

def _paths(node, path=()):
    """Every (container, key) in a JSON document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield node, k
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield node, i
            yield from _paths(v, path + (i,))


def hostile_value(rng, old):
    pool = INTS if isinstance(old, int) and not isinstance(old, bool) else \
        STRINGS if isinstance(old, str) else OTHER
    pick = rng.random()
    if pick < 0.6:
        return rng.choice(pool)
    if pick < 0.7 and isinstance(old, int) and not isinstance(old, bool):
        return old + rng.choice([-1, 1])
    return rng.choice(INTS + STRINGS + OTHER)


def mutate_field(rng, d):
    places = list(_paths(d))
    parent, key = rng.choice(places)
    parent[key] = hostile_value(rng, parent[key])


def mutate_structure(rng, d):
    """Mutations of meaning: order, references, views, placement, backends (on a
    document an earlier mutation broke, a field mutation instead)."""
    try:
        _mutate_structure(rng, d)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        mutate_field(rng, d)


def _mutate_structure(rng, d):
    tensors, nodes = d.get("tensors"), d.get("nodes")
    if not isinstance(tensors, list) or not tensors or not isinstance(nodes, list):
        return mutate_field(rng, d)
    n = len(tensors)
    t = rng.choice(tensors)
    if not isinstance(t, dict):
        return
    kind = rng.randrange(14)
    if kind == 0 and len(nodes) > 1:                    # two nodes swap places
        i, j = rng.randrange(len(nodes)), rng.randrange(len(nodes))
        nodes[i], nodes[j] = nodes[j], nodes[i]
    elif kind == 1:
        nodes.reverse()
    elif kind == 2 and isinstance(t.get("src"), list):  # a source anywhere (cycles too)
        t["src"] = t["src"] + [rng.randrange(n)] if len(t["src"]) < 10 else t["src"][:-1]
    elif kind == 3:                                     # a view of anything, anywhere
        t["view_src"] = rng.randrange(n)
        t["view_offs"] = rng.choice([0, 4, 2**40, 2**64 - 1])
    elif kind == 4:                                     # placed in some buffer type
        bufts = [b.get("buffer_type") for b in d.get("backends", []) if isinstance(b, dict)]
        t["buffer"] = {"buffer_type": rng.choice(bufts or ["CPU"]),
                       "usage": rng.choice(["any", "weights", "compute"])}
    elif kind == 5:                                     # assigned to some backend
        names = [b.get("name") for b in d.get("backends", []) if isinstance(b, dict)]
        t["backend"] = rng.choice(names or ["CPU"])
    elif kind == 6:
        t["flags"] = rng.sample(["INPUT", "OUTPUT", "PARAM", "LOSS", "COMPUTE"], rng.randrange(4))
    elif kind == 7 and isinstance(t.get("ne"), list) and len(t["ne"]) == 4:
        t["ne"][rng.randrange(4)] = rng.choice([0, 1, 7, 2**20, 2**40, 2**62])
    elif kind == 8 and isinstance(t.get("nb"), list) and len(t["nb"]) == 4:
        t["nb"][rng.randrange(4)] = rng.choice([0, 1, 3, 2**40, 2**63, 2**64 - 1])
    elif kind == 9 and d.get("backends"):               # a backend twice, or none, or many
        b = d["backends"]
        choice = rng.randrange(4)
        if choice == 0:
            b.append(copy.deepcopy(rng.choice(b)))
        elif choice == 1:
            b.pop(rng.randrange(len(b)))
        elif choice == 2:
            b.extend(copy.deepcopy(b[-1]) for _ in range(rng.choice([15, 60, 1000])))
        else:
            b.reverse()
    elif kind == 10 and d.get("backends"):              # odd buffer types
        b = rng.choice(d["backends"])
        if isinstance(b, dict):
            b["buffer_type_alignment"] = rng.choice([1, 2, 4096, 2**20, 2**40, 2**62, 2**63])
            b["buffer_type_max_size"] = rng.choice([None, 1, 32, 100, 4096, 2**64 - 1])
    elif kind == 11:
        d["graph_size"] = rng.choice([1, 2, 3, 5, len(nodes), len(nodes) + 1, 2 * n, 2**31 - 1])
    elif kind == 12:
        d["parallel"] = not d.get("parallel")
    else:
        lst = rng.choice(["nodes", "leafs"])
        if isinstance(d.get(lst), list):
            if d[lst] and rng.random() < 0.5:
                d[lst].append(rng.choice(d[lst]))       # listed twice
            else:
                d[lst].append(rng.randrange(n + 2))


def mutate_bytes(rng, text):
    raw = text.encode("utf-8", "surrogatepass")
    kind = rng.randrange(6)
    if kind == 0:
        return raw[:rng.randrange(len(raw) + 1)]
    if kind == 1:
        pos = rng.randrange(len(raw) + 1)
        return raw[:pos] + bytes([rng.choice([0x80, 0xC0, 0xFF, 0xED])]) + raw[pos:]
    if kind == 2:
        return text.encode("utf-16", "surrogatepass")
    if kind == 3:
        depth = rng.choice([100, 1000, 100000])
        return ("[" * depth + "]" * depth).encode()
    if kind == 4:
        return raw.replace(b'"name"', b'"na\\ud800me"', 1)
    return b"\xef\xbb\xbf" + raw                        # a BOM: still a valid case


# ---------------------------------------------------------------------------
# running a case as the command line does

def run_case(source):
    """The plan JSON's SHA1."""
    from ggml_py.tools.cases import load_case
    from ggml_py.tools.planning import plan_case
    case = load_case(source)
    sched, plan = plan_case(case, alloc=True)
    text = json.dumps(plan.to_dict(), sort_keys=True)
    try:
        sched.validate_allocation()
    finally:
        sched.close()
    return hashlib.sha1(text.encode()).hexdigest()


def mutated_case(round_seed, cases, tmp):
    """(base case name, mutated case: a dict, or the path of a file of mutated bytes)."""
    r = random.Random(round_seed)
    name, base = r.choice(cases)
    d = copy.deepcopy(base)
    # most rounds keep the file's form and change its meaning, so that they reach
    # the scheduler and the allocator; the others break the form
    field_share = 0.1 if r.random() < 0.7 else 0.6
    for _ in range(r.randint(1, 3)):
        (mutate_field if r.random() < field_share else mutate_structure)(r, d)
    if r.random() < 0.25:
        path = os.path.join(tmp, f"r{round_seed}.case.json")
        with open(path, "wb") as f:
            f.write(mutate_bytes(r, json.dumps(d, ensure_ascii=False)))
        return name, path
    return name, d


def fuzz(seed, rounds, seconds, max_nodes, replay=None, outcomes=False):
    from ggml_py.errors import AllocationError, GgmlPyError
    rng = random.Random(seed)
    cases = base_cases(max_nodes)
    tmp = tempfile.mkdtemp(prefix="ggml_py_fuzz_")
    problems, counts = [], {"plan": 0, "error": 0}
    start = time.perf_counter()
    for k in range(rounds):
        if time.perf_counter() - start > seconds:
            break
        round_seed = rng.randrange(2**32) if replay is None else replay
        name, source = mutated_case(round_seed, cases, tmp)
        print(f"round {k} seed {round_seed} case {name}", flush=True)
        signal.alarm(ROUND_TIMEOUT_S)
        try:
            digest = run_case(source)
            counts["plan"] += 1
            if outcomes:
                print(f"outcome {k} plan {digest}", flush=True)
        except Timeout:
            problems.append({"round": k, "seed": round_seed, "case": name, "error": "hang"})
        except GgmlPyError as e:
            counts["error"] += 1
            if outcomes:
                message = str(e).replace(tmp, "<tmp>")     # (the files of mutated bytes)
                # (what the machine has free is no decision of the scheduler's)
                message = re.sub(r"the \d+ bytes \([\d.]+ GiB\) of memory available",
                                 "the memory available", message)
                print(f"outcome {k} {type(e).__name__} {getattr(e, 'kind', '')} "
                      f"{ascii(message)[:300]}", flush=True)
            if isinstance(e, AllocationError) and "invalid allocation" in str(e):
                # the proof failed: a wrong plan
                problems.append({"round": k, "seed": round_seed, "case": name,
                                 "error": f"unsound allocation: {e}"[:400]})
        except BaseException as e:       # noqa: BLE001 -- the point of the fuzzer
            if isinstance(e, KeyboardInterrupt):
                raise
            problems.append({"round": k, "seed": round_seed, "case": name,
                             "error": f"{type(e).__module__}.{type(e).__name__}: {e}"[:400]})
        finally:
            signal.alarm(0)
    return problems, counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-nodes", type=int, default=200)
    ap.add_argument("--replay", type=int, help="run the one round of this round seed")
    ap.add_argument("--outcomes", action="store_true",
                    help="print each round's plan digest or error (to diff two builds)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    problems, counts = fuzz(args.seed, 1 if args.replay is not None else args.rounds,
                            args.seconds, args.max_nodes, args.replay, args.outcomes)
    for p in problems:
        print("PROBLEM " + json.dumps(p), flush=True)
    print("SUMMARY " + json.dumps({**counts, "problems": len(problems)}), flush=True)


if __name__ == "__main__":
    main()
