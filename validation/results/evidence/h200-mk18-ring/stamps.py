"""Where a matmul task's time goes, from a trace taken with -DMK_TRACE_X=1 or 2 (mk_kernel.cu):
per op role (qkv_proj, o_proj, ...), the mean µs from the task's start to stamp 0 (1: its input rows
are in; 2: its first page is in), from stamp 0 to the end of its last page (stamp 3), and the flush
(stamp 3 to the end of the device function, stamp 2). Prints one JSON object.
    python3 stamps.py TRACE.npz X"""
import json
import sys

import numpy as np

path, x = sys.argv[1], int(sys.argv[2])
with np.load(path) as z:
    st, ops, names = z["stamps"].astype(np.int64), z["tasks"][:, 1], [str(n) for n in z["ops"]]
role = np.array([names[i].split(".", 1)[-1] for i in ops])
ok = (st[:, 0] > 0) & (st[:, 3] > 0)
out = {}
for r in sorted(set(role[ok])):
    m = ok & (role == r)
    s = st[m]
    out[r] = {"tasks": int(m.sum()),
              ("x_in_us" if x == 1 else "first_page_us"): round(float((s[:, 0] - s[:, 1]).mean()) / 1e3, 3),
              "pages_us": round(float((s[:, 3] - s[:, 0]).mean()) / 1e3, 3),
              "flush_us": round(float((s[:, 2] - s[:, 3]).mean()) / 1e3, 3),
              "compute_us": round(float((s[:, 2] - s[:, 1]).mean()) / 1e3, 3)}
print(json.dumps(out))
