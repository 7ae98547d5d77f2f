"""Checks the graph_nodes / graph_saved_bytes series of trace-graph-nodes.cpp."""
import json
import sys

src = open(sys.argv[0][:-3]).read().splitlines()
line_of = {tag: i + 1 for i, l in enumerate(src) for tag in ("KEPT", "FLAT", "BACKWARD") if "// " + tag in l}
series = {tag: [] for tag in line_of}
for l in open(sys.argv[1]):
    e = json.loads(l)
    for tag, line in line_of.items():
        if e.get("ev") == "op" and e.get("line") == line and e.get("name") == "matmul":
            series[tag].append((e["graph_nodes"], e["graph_saved_bytes"]))
kept, flat, back = series["KEPT"], series["FLAT"], series["BACKWARD"]
assert len(kept) == len(flat) == len(back) == 6, series
# kept: the nodes and saved bytes grow by the same amount every iteration
steps = [b[0] - a[0] for a, b in zip(kept, kept[1:])]
assert len(set(steps)) == 1 and steps[0] >= 3, kept
assert all(b[1] > a[1] for a, b in zip(kept, kept[1:])), kept
# flat: the same ops, detached before they are kept
assert len(set(flat)) == 1 and flat[0] == kept[0], flat
# after backward() the saved tensors are freed but the nodes stay
assert all(b[0] > a[0] for a, b in zip(back, back[1:])), back
assert back[-1][1] == back[0][1], back
print("ok", kept, flat, back)
