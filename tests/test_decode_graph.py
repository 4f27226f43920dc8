"""The decode graph kept across steps (models.decode_graph): a decode step after the
first builds, splits and allocates nothing, and its logits are those of a graph
built for the step (cpy into views at n_past) up to the last bit."""

import numpy as np
import pytest

from ggml_py.backends.cpu import CPUBackend
from ggml_py.backends.numpy_device import NumpyDeviceBackend
from ggml_py.errors import ModelError
from ggml_py.models.decode_graph import DecodeGraph
from ggml_py.models.reference import reference_logits
from ggml_py.models.transformer import Model, ModelConfig, Session, moe_config

SMALL = dict(n_vocab=96, n_ctx=32, n_embd=64, n_head=4, n_head_kv=2, n_layer=2, n_ff=96,
             kv_pad=8)
PROMPT = [5, 17, 3]
CONFIGS = [ModelConfig(**SMALL),
           moe_config("moe_topk", **SMALL, n_expert=4, n_expert_used=2, n_ff_exp=32),
           moe_config("moe_dense", **SMALL, n_expert=4, n_ff_exp=32, cache_type="f32")]


def _steps(sess, n):
    """Greedy decode: the logits of the prompt's last token, then of n steps."""
    out = [sess.forward(PROMPT, logits="last")]
    for _ in range(n):
        out.append(sess.forward([int(np.argmax(out[-1][-1]))], logits="last"))
    return out


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_kept_graph_gives_the_same_logits(cfg):
    cpu = CPUBackend()
    model = Model.random(cfg, seed=1).place(cpu)
    kept = Session(model, [cpu])
    built = Session(model, [cpu], reuse_decode_graph=False)
    n = cfg.n_ctx - len(PROMPT) - 1          # to the end of the context: every pad window
    got, want = _steps(kept, n), _steps(built, n)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    tokens = PROMPT + [int(np.argmax(x[-1])) for x in got[:-1]]
    ref = reference_logits(model, tokens)[-1]
    assert np.sum((ref - got[-1][-1]) ** 2) / np.sum(ref ** 2) < 1e-5


def test_decode_steps_build_split_and_allocate_nothing():
    cfg = ModelConfig(**SMALL)
    cpu = CPUBackend()
    sess = Session(Model.random(cfg).place(cpu), [cpu])
    _steps(sess, 12)                 # positions 3..14: pad windows [0, 8) and [8, 16)
    sched = sess.sched
    decode = sess.history[1:]
    reused = [(h.graph_reused, h.plan_reused) for h in decode]
    # a new graph where the padded KV length grows (n_past 3 -> 8 cells, 8 -> 16)
    builds = [i for i, h in enumerate(decode) if not h.graph_reused]
    assert builds == [0, 5]
    assert all(r == (True, True) for i, r in enumerate(reused) if i not in builds)
    assert sess.decode.n_builds == 2 and sess.decode.n_reuses == 10
    assert sched.n_graph_reuses == 10
    # after the first allocation of each graph nothing is reserved again
    reallocs = sched.n_reallocs
    _steps_more = sess.forward([1], logits="last")
    assert sched.n_reallocs == reallocs and _steps_more.shape == (1, cfg.n_vocab)


def test_kept_graph_on_two_backends():
    cfg = ModelConfig(**SMALL)
    cpu, dev = CPUBackend(), NumpyDeviceBackend()
    ref_cpu = CPUBackend()
    want = _steps(Session(Model.random(cfg).place(ref_cpu), [ref_cpu],
                          reuse_decode_graph=False), 6)
    model = Model.random(cfg).place([cpu, dev], host=cpu, output_backend=dev)
    sess = Session(model, [dev, cpu])
    got = _steps(sess, 6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-6)
    assert sum(h.plan_reused for h in sess.history) >= 4


def test_decode_graph_is_one_token():
    cfg = ModelConfig(**SMALL)
    cpu = CPUBackend()
    sess = Session(Model.random(cfg).place(cpu), [cpu])
    with pytest.raises(ModelError, match="one token"):
        DecodeGraph(sess.model, sess.cache).forward([1, 2])
    # a prompt of one token goes through the kept graph as well
    sess.forward([3])
    assert sess.decode.n_builds == 1


@pytest.mark.parametrize("cfg", CONFIGS[:1] + CONFIGS[2:], ids=lambda c: c.name)
def test_kept_inputs_are_those_of_the_step(cfg):
    """Step by step (the inputs advanced in place) and after the cache is rewound (all
    written anew), the kept graph's inputs are what step_inputs gives for the position."""
    from ggml_py.models.graph import step_inputs
    cpu = CPUBackend()
    sess = Session(Model.random(cfg, seed=2).place(cpu), [cpu])
    sess.forward(PROMPT, logits="last")
    positions = list(range(len(PROMPT), 12)) + [5, 6, 7, 4]     # ahead, then rewound
    for i, n_past in enumerate(positions):
        sess.cache.n_past = n_past
        token = (7 * i + 3) % cfg.n_vocab
        sess.forward([token], logits="last")
        fw = sess.decode.kept
        want = step_inputs(cfg, np.array([token]), n_past, fw.n_kv, kv_rows=True)
        got = {t.name: values for t, values in fw.inputs}
        assert set(want) <= set(got)
        for name, values in want.items():
            np.testing.assert_array_equal(got[name].reshape(-1),
                                          np.asarray(values).reshape(-1), err_msg=name)


def test_kept_graph_over_the_sliding_layers_own_cache():
    """gemma2 with a window of 4 and ubatches of 16: the sliding layers' cache has 256
    cells (4 + 16, padded to 256), which the steps here run past, taking cells again. The
    kept graph's logits are those of a graph built for each step, bit for bit, and the
    float64 reference's; its inputs, advanced in place or written anew after a rewind,
    are what step_inputs gives for the step's cells."""
    from ggml_py.models.config import arch_config
    from ggml_py.models.graph import step_inputs
    cfg = arch_config("gemma2", **{**SMALL, "n_ctx": 320, "kv_pad": 32}, n_swa=4)
    cpu = CPUBackend()
    model = Model.random(cfg, seed=3).place(cpu)
    tokens = np.random.default_rng(1).integers(0, cfg.n_vocab, 300).tolist()
    rows = {}
    for reuse in (True, False):
        sess = Session(model, [cpu], reuse_decode_graph=reuse, n_ubatch=16)
        assert sess.cache.cells_swa == 256 and sess.cache.k[0].ne[1] == 256
        out = [sess.forward(tokens[i:i + 16]) for i in range(0, 240, 16)]
        for tok in tokens[240:]:
            out.append(sess.forward([tok]))
            fw = sess.decode.kept if reuse else None
            if fw is not None:
                want = step_inputs(cfg, np.array([tok]), fw.n_past, fw.n_kv, kv_rows=True,
                                   swa=fw.swa)
                got = {t.name: values for t, values in fw.inputs}
                for name, values in want.items():
                    np.testing.assert_array_equal(got[name].reshape(-1),
                                                  np.asarray(values).reshape(-1), err_msg=name)
        rows[reuse] = np.concatenate(out)
        assert sess.cache.swa.pos.max() == 299 and sorted(sess.cache.swa.pos)[-256] == 44
    np.testing.assert_array_equal(rows[True], rows[False])
    ref = reference_logits(model, tokens)
    assert np.sum((ref - rows[True]) ** 2) / np.sum(ref ** 2) < 1e-5
    # rewound: positions 290.. again, their cells written anew
    sess = Session(model, [cpu], n_ubatch=16)
    for i in range(0, 288, 16):
        sess.forward(tokens[i:i + 16])
    sess.forward(tokens[288:289])
    sess.cache.n_past = 280
    got = sess.forward(tokens[280:281])
    fw = sess.decode.kept
    want = step_inputs(cfg, np.array(tokens[280:281]), 280, fw.n_kv, kv_rows=True, swa=fw.swa)
    for t, values in fw.inputs:
        if t.name in want:
            np.testing.assert_array_equal(values.reshape(-1), np.asarray(want[t.name]).reshape(-1))
    assert np.sum((ref[280] - got[-1]) ** 2) / np.sum(ref[280] ** 2) < 1e-5


def test_sliding_cache_refuses_a_batch_it_cannot_hold():
    """A batch needs a free cell per token in the sliding layers' cache: past what the
    window leaves free of its 256 cells, a ModelError names the cache and the ubatch (llama.cpp
    splits such a batch into ubatches); --swa-full's cache holds the whole context."""
    from ggml_py.errors import ArgumentError
    from ggml_py.models.config import arch_config
    from ggml_py.models.model import KVCache
    cfg = arch_config("gemma2", **{**SMALL, "n_ctx": 512}, n_swa=8)
    cpu = CPUBackend()
    model = Model.random(cfg).place(cpu)
    sess = Session(model, [cpu], n_ubatch=16)
    sess.forward([i % cfg.n_vocab for i in range(250)])
    with pytest.raises(ModelError, match=r"sliding layers' cache of 256 cells has no room for "
                                         r"260 tokens .*at most 16 tokens"):
        sess.forward([i % cfg.n_vocab for i in range(260)])     # (249 cells left)
    assert sess.cache.n_past == 250 and sess.cache.swa.pos.max() == 249    # (unchanged)
    assert KVCache(model, 16, swa_full=True).cells_swa == 512
    with pytest.raises(ArgumentError, match="n_ubatch"):
        KVCache(model, 0)
