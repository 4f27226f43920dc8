"""Scale a layered case file to another depth: a real-shaped graph of any size from a
small one (the 80-layer llama case to 3,120 layers gives issue 36's 100k-node graph).

    python bench/scale_case.py CASE.case.json N_LAYERS OUT.case.json [--graph-size N]

Layers are told apart by the layer number in tensor names (`blk.7.`, `cache_k_l7`,
`kq-7`). The first and last layers are kept as they are, the second is the template of
every layer between; a tensor of no layer is kept once. References to the previous
layer follow the copy. graph_size grows by the source's graph_size per layer unless
given.
"""

from __future__ import annotations

import argparse
import json
import re


LAYER = re.compile(r"(blk\.|_l|-)(\d+)(?=$|\.| )")


def layer_of(name):
    m = LAYER.search(name)
    return None if m is None else int(m.group(2))


def renumber(name, layer):
    return LAYER.sub(lambda m: f"{m.group(1)}{layer}", name)


def scale_case(d, n_layers, graph_size=None):
    tensors = d["tensors"]
    layers = [layer_of(t["name"]) for t in tensors]
    last = max(x for x in layers if x is not None)
    if n_layers < 3 or last < 2:
        raise SystemExit("scale_case: needs at least 3 layers in and out")
    # source layer of each new layer, and the new index of (source id, new layer)
    source = {0: 0, n_layers - 1: last}
    source.update({l: 1 for l in range(1, n_layers - 1)})
    out, new_id = [], {}

    members = {}                     # source layer -> its tensor ids, in order
    for i, sl in enumerate(layers):
        members.setdefault(sl, []).append(i)
    ordinal = {i: k for ids in members.values() for k, i in enumerate(ids)}

    def new_ref(s, layer):
        """The new id of source s of a tensor copied into `layer` (None: no layer): the
        tensor at s's place in the layer as far before `layer` as s's was."""
        sl = layers[s]
        if sl is None:
            return new_id[(s, None)]
        at = sl if layer is None and sl == 0 else \
            n_layers - 1 - (last - sl) if layer is None else layer - (source[layer] - sl)
        return new_id[(members[source[at]][ordinal[s]], at)]

    def emit(i, layer):
        t = dict(tensors[i])
        t["id"] = len(out)
        if layer is not None:
            t["name"] = renumber(t["name"], layer)
        new_id[(i, layer)] = t["id"]
        out.append(t)

    order = [(i, None) for i in members.get(None, [])]
    for layer in range(n_layers):
        order += [(i, layer) for i in members[source[layer]]]
    for i, layer in order:
        emit(i, layer)
    for (i, layer), k in new_id.items():
        t = out[k]
        t["src"] = [None if s is None else new_ref(s, layer) for s in t["src"]]
        if t["view_src"] is not None:
            t["view_src"] = new_ref(t["view_src"], layer)

    def scaled(ids):
        head = [new_id[(i, None)] for i in ids if layers[i] is None and
                ids.index(i) < next(k for k, j in enumerate(ids) if layers[j] is not None)]
        tail = [new_id[(i, None)] for i in ids if layers[i] is None and new_id[(i, None)] not in head]
        body = [new_id[(i, layer)] for layer in range(n_layers)
                for i in ids if layers[i] == source[layer]]
        return head + body + tail

    r = dict(d)
    r["name"] = f"{d['name']}-{n_layers}L"
    r["tensors"] = out
    r["nodes"] = scaled(d["nodes"])
    r["leafs"] = scaled(d["leafs"])
    per_layer = d["graph_size"] / (last + 1)
    r["graph_size"] = graph_size or int(d["graph_size"] + per_layer * (n_layers - last - 1))
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case")
    ap.add_argument("n_layers", type=int)
    ap.add_argument("out")
    ap.add_argument("--graph-size", type=int)
    args = ap.parse_args(argv)
    with open(args.case) as f:
        d = json.load(f)
    r = scale_case(d, args.n_layers, args.graph_size)
    from ggml_py.tools.cases import format_case
    with open(args.out, "w") as f:
        f.write(format_case(r))
    print(f"{args.out}: {len(r['nodes'])} nodes, {len(r['leafs'])} leafs, "
          f"graph_size {r['graph_size']}")


if __name__ == "__main__":
    main()
