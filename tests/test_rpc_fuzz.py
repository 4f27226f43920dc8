"""A hostile server, fuzzed: a real ggml server's session (protocol 4 and protocol 7,
recorded in tests/data/rpc/v{4,7}_session.json) replayed with one reply mutated per round (a field set
to an edge value, a flipped byte, a lying size header, a reply cut short, bytes nobody
asked for, an earlier reply again, a close, a hang, a byte-by-byte trickle). Each round's
client runs in its own process under a hard timeout. Every round must end with the
genuine result, or with an RPCError naming the endpoint and the command (an
AllocationError only with an RPCError as its cause), within one command's deadline:
no crash, no hang, no foreign exception, no wrong result. Only loopback is used.

GGML_PY_RPC_FUZZ_SEED and GGML_PY_RPC_FUZZ_ROUNDS choose other rounds.
"""

import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import rpc_fuzz

SEED = int(os.environ.get("GGML_PY_RPC_FUZZ_SEED", "35"))
ROUNDS = int(os.environ.get("GGML_PY_RPC_FUZZ_ROUNDS", "80"))
TIMEOUT = 1.0          # the client's deadline per command
SLACK = 2.0            # start-up of a client process and the scenario's own work


def run_round(exchanges, mutation):
    """Replay with `mutation` to a client process: its JSON outcome, or a dict saying
    it crashed or hung."""
    server = rpc_fuzz.ReplayServer(exchanges, mutation, trickle_interval=0.6 * TIMEOUT)
    try:
        proc = subprocess.run([sys.executable, rpc_fuzz.__file__, "client", str(server.port),
                               str(TIMEOUT)], capture_output=True, text=True,
                              timeout=TIMEOUT + SLACK + 5)
    except subprocess.TimeoutExpired:
        return {"kind": "hang"}
    finally:
        server.close()
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return {"kind": "crash", "rc": proc.returncode, "stderr": proc.stderr[-2000:]}
    return json.loads(lines[-1])


def problem(outcome, mutation, genuine):
    """What is wrong with a round's outcome (None: nothing)."""
    kind = outcome["kind"]
    if kind in ("hang", "crash", "other"):
        return kind
    if outcome["seconds"] > TIMEOUT + SLACK:
        return f"took {outcome['seconds']:.1f} s"
    if kind == "ok":
        if outcome["result"] != genuine and not (mutation and mutation["data"]):
            return "a wrong result taken for a genuine one"
    elif kind == "rpc":
        if not outcome["endpoint"] or not outcome["command"]:
            return "an RPCError without endpoint or command"
    elif kind == "alloc" and outcome["cause"] != "RPCError" and "cannot allocate" not in outcome["message"]:
        return "an AllocationError that lost its RPCError"
    return None


VERSIONS = pytest.mark.parametrize("protocol", [4, 7], ids=["v4", "v7"])


@VERSIONS
def test_genuine_replay_gives_the_recorded_result(protocol):
    session = rpc_fuzz.load_session(protocol)
    out = run_round(session["exchanges"], None)
    assert out["kind"] == "ok" and out["result"] == session["result"], out


@VERSIONS
def test_fuzzed_replies_are_clean_errors_or_the_genuine_result(protocol):
    session = rpc_fuzz.load_session(protocol)
    rng = random.Random(SEED + protocol - 4)
    mutations = [rpc_fuzz.mutate(rng, session["exchanges"]) for _ in range(ROUNDS)]
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(lambda m: run_round(session["exchanges"], m), mutations))
    bad = []
    for i, (m, out) in enumerate(zip(mutations, outcomes)):
        why = problem(out, m, session["result"])
        if why:
            shown = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in m.items()}
            bad.append(f"round {i} (v{protocol}, seed {SEED}): {why}: {shown} -> {out}")
    assert not bad, "\n".join(bad)
    kinds = {o["kind"] for o in outcomes}
    assert "rpc" in kinds and "ok" in kinds     # the rounds reach both ends
    assert time.monotonic() - t0 < 45


def test_recording_is_what_a_ggml_server_answers(rpc_server_factory, rpc_protocol):
    """The stored sessions are still genuine: the same commands and reply sizes and the
    same result from a live server of each version (addresses differ from run to run)."""
    live = rpc_fuzz.record(rpc_server_factory().endpoint, rpc_protocol)
    stored = rpc_fuzz.load_session(rpc_protocol)
    shape = lambda s: [(c, None if r is None else len(r)) for c, r in s["exchanges"]]
    assert shape(live) == shape(stored)
    assert live["result"] == stored["result"]
