#!/usr/bin/env python3
"""What `GroupQueryAttention` with a shared past/present buffer would give mmq's decoder packages,
measured before the compiler emits it: rewrites a copy of a package (`mmq compile --package`,
float KV cache) so that each layer's standard `Attention` over `Concat(past, new)` becomes
`com.microsoft.GroupQueryAttention`, then `tools/genai_bench.py` runs both. A measuring tool, not
a compile step: the rewrite assumes what onnxruntime-genai's model builder assumes (the
attention mask is causal plus the key padding of `attention_mask`, so GQA's sequence lengths
`ReduceSum(attention_mask) - 1` replace it) and recognizes only the export forms of
`tools/bench_decoder.py`'s checkpoint.

Forms (`--form`):
- `transposed`: GQA on the 4-D `[B, H, S, D]` tensors the export has, moved to `[B, S, H*D]`
  and back with `Transpose` + `Reshape` around it;
- `3d`: GQA on the 3-D projections, the rotary embedding on them (opset-23 `RotaryEmbedding`
  with `num_heads`, the export's own cos/sin), the export's output `Transpose` + `Reshape`
  dropped;
- `packed`: GQA on the packed Q/K/V projection (no `Split`), the rotary embedding inside GQA
  (`do_rotary`, cos/sin tables of `max_position_embeddings` positions from the checkpoint's
  `inv_freq`, positions taken from the sequence lengths, as the builder does).

`--no-share` leaves `past_present_share_buffer` false (the past grows by a copy per step).

    venv/bin/python tools/gqa_probe.py PKG OUT --heads 8 --kv-heads 2 --head-dim 64 --form packed
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("package", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, required=True)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--form", choices=["transposed", "3d", "packed"], default="packed")
    ap.add_argument("--no-share", action="store_true")
    ap.add_argument("--max-positions", type=int, default=1024)
    a = ap.parse_args()
    h, kv, d = a.heads, a.kv_heads, a.head_dim
    if a.out.exists():
        shutil.rmtree(a.out)
    shutil.copytree(a.package, a.out)
    m = onnx.load(str(a.out / "model.onnx"), load_external_data=False)
    g = m.graph
    prod = {o: n for n in g.node for o in n.output}
    readers: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)

    def ints(name, vals):
        return helper.make_tensor(name, TensorProto.INT64, [len(vals)], vals)

    g.initializer.extend([ints("gqa_axes1", [1]), ints("gqa_one", [1]),
                          ints("gqa_q3", [0, 0, h * d]), ints("gqa_kv3", [0, 0, kv * d]),
                          ints("gqa_q4", [0, 0, h, d])])
    # GQA's sequence lengths: the valid keys per row, less one; the total length.
    nodes_out = [
        helper.make_node("ReduceSum", ["attention_mask", "gqa_axes1"], ["gqa_len"], keepdims=0),
        helper.make_node("Sub", ["gqa_len", "gqa_one"], ["gqa_len1"]),
        helper.make_node("Cast", ["gqa_len1"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["gqa_total64"], start=1, end=2),
        helper.make_node("Cast", ["gqa_total64"], ["gqa_total1"], to=TensorProto.INT32),
        helper.make_node("Squeeze", ["gqa_total1"], ["total_seq_len"]),
    ]
    if a.form == "packed":
        inv = next(numpy_helper.to_array(t) for t in g.initializer
                   if t.name.endswith("rotary_emb.inv_freq"))
        freqs = np.outer(np.arange(a.max_positions, dtype=np.float32), inv.astype(np.float32))
        g.initializer.extend([numpy_helper.from_array(np.cos(freqs), "gqa_cos"),
                              numpy_helper.from_array(np.sin(freqs), "gqa_sin")])

    def behind(x4):
        """The 3-D tensor behind `[RotaryEmbedding](Transpose(Reshape(x3)))`, and the rotary."""
        n = prod[x4]
        rot = None
        if n.op_type == "RotaryEmbedding":
            rot, n = n, prod[n.input[0]]
        assert n.op_type == "Transpose", n.op_type
        r = prod[n.input[0]]
        assert r.op_type == "Reshape", r.op_type
        return r.input[0], rot

    replaced, dropped, count = {}, set(), 0
    for n in g.node:
        if n.op_type != "Attention" or n.domain not in ("", "ai.onnx"):
            continue
        kc, vc = prod[n.input[1]], prod[n.input[2]]
        assert kc.op_type == "Concat" and vc.op_type == "Concat", n.name
        i = count
        scale = {a_.name: a_.f for a_ in n.attribute if a_.name == "scale"}
        past = [kc.input[0], vc.input[0], "seqlens_k", "total_seq_len"]
        present = [kc.output[0], vc.output[0]]
        new = []
        if a.form == "transposed":
            q4, k4, v4 = n.input[0], kc.input[1], vc.input[1]
            for x, shape, name in ((q4, "gqa_q3", "q"), (k4, "gqa_kv3", "k"), (v4, "gqa_kv3", "v")):
                new += [helper.make_node("Transpose", [x], [f"gqa{i}_{name}t"], perm=[0, 2, 1, 3]),
                        helper.make_node("Reshape", [f"gqa{i}_{name}t", shape], [f"gqa{i}_{name}"])]
            new += [
                helper.make_node("GroupQueryAttention",
                                 [f"gqa{i}_q", f"gqa{i}_k", f"gqa{i}_v", *past],
                                 [f"gqa{i}_o", *present], domain="com.microsoft", num_heads=h,
                                 kv_num_heads=kv, **scale),
                helper.make_node("Reshape", [f"gqa{i}_o", "gqa_q4"], [f"gqa{i}_o4"]),
                helper.make_node("Transpose", [f"gqa{i}_o4"], [n.output[0]], perm=[0, 2, 1, 3]),
            ]
            dropped |= {id(kc), id(vc)}
        else:
            q3, qrot = behind(n.input[0])
            k3, krot = behind(kc.input[1])
            v3, _ = behind(vc.input[1])
            (t,) = readers[n.output[0]]
            (r,) = readers[t.output[0]]
            assert t.op_type == "Transpose" and r.op_type == "Reshape"
            if a.form == "packed":
                split = prod[q3]
                assert split.op_type == "Split" and list(split.output) == [q3, k3, v3]
                ins = [split.input[0], "", "", *past, "gqa_cos", "gqa_sin"]
                extra = {"do_rotary": 1}
            else:
                new += [
                    helper.make_node("RotaryEmbedding", [q3, *qrot.input[1:3]], [f"gqa{i}_q"],
                                     num_heads=h),
                    helper.make_node("RotaryEmbedding", [k3, *krot.input[1:3]], [f"gqa{i}_k"],
                                     num_heads=kv),
                ]
                ins = [f"gqa{i}_q", f"gqa{i}_k", v3, *past]
                extra = {}
            new.append(helper.make_node("GroupQueryAttention", ins, [r.output[0], *present],
                                        domain="com.microsoft", num_heads=h, kv_num_heads=kv,
                                        **scale, **extra))
            dropped |= {id(kc), id(vc), id(t), id(r)}
        replaced[id(n)] = new
        count += 1
    for n in g.node:
        if id(n) in replaced:
            nodes_out.extend(replaced[id(n)])
        elif id(n) not in dropped:
            nodes_out.append(n)
    # What the graph outputs no longer read (the mask, the Split) goes.
    needed = {o.name for o in g.output}
    kept = []
    for n in reversed(nodes_out):
        if any(o in needed for o in n.output):
            kept.append(n)
            needed |= {i for i in n.input if i}
    del g.node[:]
    g.node.extend(reversed(kept))
    del g.value_info[:]
    onnx.save(m, str(a.out / "model.onnx"))
    cfg_path = a.out / "genai_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["search"]["past_present_share_buffer"] = not a.no_share
    cfg_path.write_text(json.dumps(cfg, indent=2))
    print(f"{a.out}: {count} attention nodes rewritten ({a.form}), {len(g.node)} nodes, "
          f"shared buffer {not a.no_share}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
