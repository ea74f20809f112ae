"""mirage-onnx show FUSED: what a fused model holds, read back from the model
and its manifest. Run by the binary (cli/show_cmd.c) with the Python of
$MIRAGE_ONNX_PYTHON (else python3), which needs the onnx package.

For each region of the manifest: the fused node that replaced it (op type,
inputs and outputs with their dtypes and shapes), the ONNX nodes it
replaced, its μGraph level by level (kernels; each block graph's grid,
for-loop, tiled inputs, ops, accumulators, thread graphs and saves), the
evidence it was verified by (finite-field trials and their error bound,
the float check, the CPU kernel's check), the estimated gain, what
--profile measured, the GPUs each variant serves; for a region left
unfused, why. --svg FILE draws one region's μGraph (kernel, block and
thread levels) as an SVG picture.
"""
import sys

# Run as `python -c SCRIPT`, Python puts the working directory first on the
# module path: a user's onnx/ folder or numpy.py there would be imported in
# place of the packages (and a json.py in place of the standard library's).
# Nothing this script imports comes from the working directory.
if sys.path and sys.path[0] in ("", "."):
    del sys.path[0]

import argparse
import html
import json
import os
import stat
import tempfile

PROG = "mirage-onnx show"
DTYPES = {1: "float", 10: "float16", 16: "bfloat16", 11: "double", 7: "int64", 6: "int32",
          9: "bool"}


class Failure(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise Failure(message + " (see mirage-onnx show --help)")


def first_line(e):
    s = str(e).strip().splitlines()
    return s[0] if s else type(e).__name__


def dims_text(shape):
    return "[" + ",".join(str(d) for d in shape) + "]"


# ---- the μGraph, from the manifest's steps (superopt/mugraph/mugraph_io.c) ----

class Kernel:
    def __init__(self, index, kind):
        self.index, self.kind = index, kind  # "block" or a pre-defined op
        self.grid, self.forloop = [1, 1, 1], 1
        self.ins, self.outs = [], []     # kernel tensors read and written
        self.tiles = []                  # (text, thread group or None)
        self.threads = []                # (first, last) tile ranges
        self.saves = []                  # what each save writes
        self.op = None


def mugraph_levels(mg):
    """The kernels of a μGraph (list of Kernel), its input and output
    tensors (name, dtype, shape) by kernel-tensor index."""
    steps = mg.get("steps", [])
    tensors, kernels, blocks, outputs = [], [], {}, []
    for s in steps:
        k = s.get("step")
        if k == "input":
            tensors.append((s.get("name", "?"), s.get("dtype", 1), s.get("shape", []), None))
        elif k == "kernel":
            kern = Kernel(len(kernels), s.get("op", "?"))
            kern.op = s.get("op", "?")
            kern.ins = list(s.get("in", []))
            kern.outs = [len(tensors)]
            tensors.append(("t%d" % len(tensors), None, None, kern.index))
            kernels.append(kern)
        elif k == "block":
            kern = Kernel(len(kernels), "block")
            kern.grid, kern.forloop = s.get("grid", [1, 1, 1]), s.get("forloop", 1)
            blocks[len(blocks)] = kern
            kernels.append(kern)
        elif k == "output":
            outputs.append((s.get("tensor"), s.get("name", "?")))
        elif k in ("iter", "op", "const", "accum", "thread", "save"):
            kern = blocks.get(s.get("block"))
            if kern is None:
                continue
            if k == "iter":
                t = s.get("tensor", 0)
                kern.ins.append(t)
                name = tensors[t][0] if 0 <= t < len(tensors) else "t%d" % t
                split = ", ".join("grid %s splits dim %d" % ("xyz"[g], d)
                                  for g, d in enumerate(s.get("imap", [])) if d >= 0)
                if s.get("fmap", -1) >= 0:
                    split += ("; " if split else "") + "for-loop walks dim %d" % s["fmap"]
                kern.tiles.append("load %s (%s)" % (name, split or "whole"))
            elif k == "op":
                extra = ""
                if "axes" in s:
                    extra = " axes %s" % s["axes"]
                kern.tiles.append("%s(%s)%s" % (s.get("op", "?"), ", ".join(
                    "#%d" % i for i in s.get("in", [])), extra))
            elif k == "const":
                v = s.get("value", 0)  # an infinity is written as a word ("-inf")
                kern.tiles.append("const %s" % (v if isinstance(v, str) else "%.6g" % v))
            elif k == "accum":
                kern.tiles.append("accumulate #%d over the for-loop (%s)" % (
                    s.get("tile", 0), s.get("kind", "sum")))
            elif k == "thread":
                kern.threads.append((s.get("first", 0), s.get("last", 0)))
            elif k == "save":
                kern.outs.append(len(tensors))
                tensors.append(("t%d" % len(tensors), None, None, kern.index))
                omap = ", ".join("grid %s -> dim %d" % ("xyz"[g], d)
                                 for g, d in enumerate(s.get("omap", [])) if d >= 0)
                kern.saves.append((s.get("tile", 0), kern.outs[-1], omap or "whole"))
    names = {t: n for t, n in outputs}
    return kernels, tensors, names


def tensor_name(tensors, names, t):
    if t in names:
        return names[t]
    if 0 <= t < len(tensors):
        return tensors[t][0]
    return "t%d" % t


def describe_mugraph(mg, out, indent="    "):
    kernels, tensors, names = mugraph_levels(mg)
    for k in kernels:
        ins = ", ".join(tensor_name(tensors, names, t) for t in dict.fromkeys(k.ins))
        outs = ", ".join(tensor_name(tensors, names, t) for t in k.outs)
        if k.kind != "block":
            out.append("%skernel %d: %s (pre-defined) of %s -> %s" % (indent, k.index + 1, k.op,
                                                                     ins, outs))
            continue
        out.append("%skernel %d: block graph, grid (%s), for-loop %d: reads %s, writes %s" % (
            indent, k.index + 1, ",".join(str(g) for g in k.grid), k.forloop, ins, outs))
        for i, text in enumerate(k.tiles):
            group = next((n for n, (a, b) in enumerate(k.threads) if a <= i <= b), None)
            mark = "  [thread graph %d]" % (group + 1) if group is not None else ""
            out.append("%s  #%-3d %s%s" % (indent, i, text, mark))
        for tile, t, omap in k.saves:
            out.append("%s       save #%d as %s (%s)" % (indent, tile,
                                                        tensor_name(tensors, names, t), omap))


def svg_of(mg, title):
    """One μGraph as an SVG: kernel-graph inputs on the left, outputs on the
    right, each kernel a box listing its block graph, thread graphs shaded."""
    kernels, tensors, names = mugraph_levels(mg)
    inputs = [i for i, t in enumerate(tensors) if t[3] is None]
    line, width = 16, 1000
    y = 50
    boxes = []
    for k in kernels:
        rows = 2 + (len(k.tiles) + len(k.saves) if k.kind == "block" else 0)
        boxes.append((k, y, rows * line + 12))
        y += rows * line + 40
    height = max(y, 60 + len(inputs) * 40) + 20
    e = html.escape
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="monospace" font-size="12">' % (width, height),
           '<text x="10" y="22" font-size="15" font-weight="bold">%s</text>' % e(title)]
    pos = {}
    for n, t in enumerate(inputs):
        ty = 60 + n * 40
        pos[t] = (150, ty)
        name, dt, shape, _ = tensors[t]
        out.append('<rect x="10" y="%d" width="140" height="28" fill="#eef" stroke="#336"/>'
                   % (ty - 14))
        out.append('<text x="14" y="%d">%s</text>' % (ty - 1, e(name[:18])))
        out.append('<text x="14" y="%d" font-size="10">%s %s</text>' % (
            ty + 11, DTYPES.get(dt, dt), e(dims_text(shape or []))))
    for k, ky, kh in boxes:
        x0 = 230
        for t in dict.fromkeys(k.ins):
            if t in pos:
                sx, sy = pos[t]
                out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>'
                           % (sx, sy, x0, ky + 14))
        out.append('<rect x="%d" y="%d" width="560" height="%d" fill="#fff" stroke="#333"/>'
                   % (x0, ky, kh))
        head = ("kernel %d: block graph, grid (%s), for-loop %d" %
                (k.index + 1, ",".join(str(g) for g in k.grid), k.forloop)
                if k.kind == "block" else "kernel %d: %s (pre-defined)" % (k.index + 1, k.op))
        out.append('<text x="%d" y="%d" font-weight="bold">%s</text>' % (x0 + 6, ky + 16,
                                                                         e(head)))
        for g, (a, b) in enumerate(k.threads):
            out.append('<rect x="%d" y="%d" width="548" height="%d" fill="#fe9" '
                       'fill-opacity="0.5"/>' % (x0 + 6, ky + 22 + a * line, (b - a + 1) * line))
            out.append('<text x="%d" y="%d" font-size="10" fill="#a60">thread graph %d</text>'
                       % (x0 + 470, ky + 34 + a * line, g + 1))
        for i, text in enumerate(k.tiles if k.kind == "block" else []):
            out.append('<text x="%d" y="%d">#%d %s</text>' % (x0 + 10, ky + 34 + i * line, i,
                                                              e(text[:70])))
        for i, (tile, t, omap) in enumerate(k.saves if k.kind == "block" else []):
            text = "save #%d as %s (%s)" % (tile, tensor_name(tensors, names, t), omap)
            out.append('<text x="%d" y="%d" fill="#060">%s</text>' % (
                x0 + 10, ky + 34 + (len(k.tiles) + i) * line, e(text[:70])))
        for n, t in enumerate(k.outs):
            oy = ky + 14 + n * 30
            pos[t] = (x0 + 560, oy)
            label = tensor_name(tensors, names, t)
            out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#888"/>'
                       % (x0 + 560, oy, x0 + 600, oy))
            out.append('<text x="%d" y="%d">%s</text>' % (x0 + 604, oy + 4, e(label[:28])))
    out.append("</svg>")
    return "\n".join(out) + "\n"


# ---- the report ----

def value_infos(model):
    vi = {}
    for t in model.graph.initializer:
        vi[t.name] = (DTYPES.get(t.data_type, t.data_type), list(t.dims))
    for v in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                 for d in t.shape.dim] if t.HasField("shape") else None
        vi[v.name] = (DTYPES.get(t.elem_type, t.elem_type), shape)
    return vi


def main():
    ap = Parser(prog=PROG, add_help=False)
    ap.add_argument("fused")
    ap.add_argument("--svg")
    ap.add_argument("--region")
    a = ap.parse_args()
    try:
        import onnx
    except ImportError as e:
        raise Failure(f"{e.name} is not installed for {sys.executable} "
                      "(set MIRAGE_ONNX_PYTHON to a Python with onnx)")
    try:
        model = onnx.load(a.fused, load_external_data=False)
    except MemoryError:
        raise
    except Exception as e:
        raise Failure(f"{a.fused}: not an ONNX model ({first_line(e)})")
    meta = {p.key: p.value for p in model.metadata_props}
    if "mirage.manifest" not in meta:
        raise Failure(f"{a.fused}: not a model mirage-onnx fused (no mirage.manifest in its "
                      "metadata)")
    folder = os.path.dirname(os.path.abspath(a.fused))
    man_name = meta["mirage.manifest"]
    if os.path.basename(man_name) != man_name:
        raise Failure(f"{a.fused}: its manifest's name {man_name!r} is not a file beside it")
    try:
        with open(os.path.join(folder, man_name), encoding="utf-8") as f:
            man = json.load(f)
    except OSError as e:
        raise Failure(f"{os.path.join(folder, man_name)}: {e.strerror or first_line(e)}")
    except ValueError as e:
        raise Failure(f"{os.path.join(folder, man_name)}: not JSON ({first_line(e)})")
    if not isinstance(man, dict) or not isinstance(man.get("regions"), list):
        raise Failure(f"{man_name}: not a mirage-onnx manifest (no regions)")
    regions = [r for r in man["regions"] if isinstance(r, dict)]
    if a.svg:
        if a.region is None:
            raise Failure("--svg needs --region N (a fused region of the report)")
        r = next((r for r in regions if str(r.get("region")) == a.region), None)
        if r is None or not isinstance(r.get("mugraph"), dict):
            raise Failure(f"no region {a.region} with a μGraph in {man_name}")
        text = svg_of(r["mugraph"], "region %s: %s" % (a.region, r.get("op_type", "")))
        # a fresh name beside FILE (created exclusively), renamed over it;
        # never over a device, a pipe or a socket (--svg /dev/null as root)
        try:
            st = os.lstat(a.svg)
        except OSError:
            st = None
        if st and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise Failure(f"{a.svg}: not a regular file; give a file name")
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(a.svg) + ".",
                                       dir=os.path.dirname(os.path.abspath(a.svg)))
            os.fchmod(fd, 0o644)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, a.svg)
        except OSError as e:
            if tmp:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            raise Failure(f"{a.svg}: {e.strerror or first_line(e)}")
        print(f"wrote {a.svg}")
        return
    vi = value_infos(model)
    # a region's fused node is named <op type>_region<label>; identical
    # regions (the layers of a model) share an op type, not a node
    nodes, guarded, larger = {}, {}, {}

    def walk_if(n, top, smaller):
        # a padded op sits in an If that runs the original ops past the
        # sizes it serves (its inputs are the op's, its outputs the top
        # If's), or, with several buckets, the next bucket's op in an If
        # of its own
        mine = None
        for at in n.attribute if n.op_type == "If" and not n.domain else ():
            for inner in at.g.node if at.name == "else_branch" else ():
                if inner.domain == man.get("domain"):
                    nodes[inner.name] = inner
                    guarded[inner.name] = top
                    mine = inner.name
                    if smaller:
                        larger[inner.name] = smaller
        for at in n.attribute if n.op_type == "If" and not n.domain else ():
            for inner in at.g.node if at.name == "then_branch" and mine else ():
                walk_if(inner, top, mine)

    for n in model.graph.node:
        if n.domain == man.get("domain"):
            nodes[n.name] = n
        walk_if(n, n, None)
    fused = [r for r in regions if r.get("fused")]
    if a.region is not None and not any(str(r.get("region")) == a.region for r in regions):
        raise Failure(f"no region {a.region} in {man_name}")
    out = [f"{a.fused}: {len(fused)} of {len(regions)} regions fused",
           f"  made from {man.get('model', '?')} for {man.get('target', '?')}; plugin "
           f"{man.get('plugin', '?')} (custom-op domain {man.get('domain', '?')})"]
    for r in regions:
        if a.region is not None and str(r.get("region")) != a.region:
            continue
        nodes_of = [str(n) for n in r.get("nodes", [])]
        shown = ", ".join(nodes_of[:4]) + (f", ... {nodes_of[-1]}" if len(nodes_of) > 5 else
                                           "".join(", " + n for n in nodes_of[4:]))
        out.append("")
        if not r.get("fused"):
            why = "its parts are regions of their own" if r.get("split_into_parts") else \
                r.get("why", "?")
            out.append(f"region {r.get('region')}: not fused ({len(nodes_of)} nodes: {shown}): "
                       f"{why}")
            continue
        op = r.get("op_type", "?")
        node = nodes.get(f"{op}_region{r.get('region')}")
        same = f", the op of region {r['identical_to']}" if r.get("identical_to") else ""
        out.append(f"region {r.get('region')}: fused as {op}{same}"
                   + (f" (node {node.name})" if node is not None else " (no node of it in "
                      "the model)"))
        out.append(f"  replaces {len(nodes_of)} nodes: {shown}")
        if node is not None and node.name in larger:
            out.append(f"  a larger bucket: runs past the sizes {larger[node.name]} serves, "
                       "inside its If's other branch; past its own, the original ops run")
        elif node is not None and node.name in guarded:
            out.append(f"  inside If {guarded[node.name].name}: past the sizes it serves, "
                       "the original ops run")
        if node is not None:
            outputs = guarded[node.name].output if node.name in guarded else node.output
            for what, names in (("inputs", node.input), ("outputs", outputs)):
                parts = []
                for n in names:
                    dt, shape = vi.get(n, ("?", None))
                    parts.append(f"{n} {dt} {dims_text(shape)}" if shape is not None else n)
                out.append(f"  {what}: " + "; ".join(parts))
        if isinstance(r.get("mugraph"), dict):
            out.append(f"  μGraph: {r.get('kernels', '?')} kernel(s)")
            describe_mugraph(r["mugraph"], out)
        v = r.get("verification") or {}
        out.append(f"  verified: {v.get('trials', '?')} finite-field trials, chance a wrong "
                   f"μGraph passes them < {v.get('error_bound', '?')} (degree "
                   f"{v.get('degree', '?')}); float check in the model's precision: largest "
                   f"relative difference {v.get('float_max_rel', '?')}")
        c = r.get("cpu_kernel_check") or {}
        if c:
            out.append(f"  generated CPU kernel against the evaluator: largest relative "
                       f"difference {c.get('max_rel', '?')} over {c.get('plans', '?')} plan(s)")
        cost, unf = r.get("cost_us"), r.get("unfused_cost_us")
        if isinstance(cost, (int, float)) and isinstance(unf, (int, float)) and cost > 0:
            out.append(f"  estimated {cost:.1f} µs against {unf:.1f} µs unfused "
                       f"({unf / cost:.2f}x, cost model for {man.get('target', '?')})"
                       + (", from the search cache, verified again" if r.get("cached") else ""))
        rows = r.get("rows")
        if isinstance(rows, dict):
            at = " and ".join(str(x) for x in rows.get("proven_at", []) or []) or "?"
            out.append(f"  serves any number of rows (batch x sequence), proven row-parallel "
                       f"over the finite field at {at} rows "
                       f"({rows.get('field_trials', '?')} trials) and its kernel checked there")
            for sz in rows.get("sizes", []) or []:
                c, u, n = sz.get("cost_us"), sz.get("unfused_cost_us"), sz.get("per_launch")
                if isinstance(c, (int, float)) and isinstance(u, (int, float)) and c > 0:
                    out.append(f"  launches of {n} row{'' if n == 1 else 's'}: estimated "
                               f"{c:.1f} µs against {u:.1f} µs unfused ({u / c:.2f}x)")
            for sz in rows.get("sizes_left_out", []) or []:
                n = sz.get("per_launch")
                out.append(f"  launches of {n} row{'' if n == 1 else 's'}: left out: "
                           f"{sz.get('why', '?')}")
        p = r.get("profile")
        if isinstance(p, dict) and isinstance(p.get("us"), list):
            times = ", ".join("#%d %s" % (i + 1, "%.1f µs" % u if isinstance(u, (int, float))
                                          else "not timed") for i, u in enumerate(p["us"]))
            out.append(f"  profiled on {p.get('gpu', '?')}: {times}; kept "
                       f"#{int(p.get('kept', 0)) + 1}")
        for var in r.get("variants", []) or []:
            if isinstance(var, dict) and var.get("serves"):
                out.append(f"  variant {var.get('variant')}: {var.get('smem_bytes', '?')} bytes "
                           f"of shared memory per block, for {', '.join(var.get('serves', []))}")
        out.append(f"  kernels in the plugin: CPU{', CUDA' if r.get('cuda') else ''}"
                   f"{', TensorRT' if r.get('tensorrt') else ''}")
    print("\n".join(out))


def top():
    try:
        main()
    except Failure as e:
        code, msg = 1, str(e)
    except MemoryError:
        code, msg = 3, "out of memory"
    except KeyboardInterrupt:
        code, msg = 130, "interrupted"
    except BrokenPipeError:
        return
    except Exception as e:  # a bug here: still one line, never a traceback
        code, msg = 3, f"internal error: {type(e).__name__}: {first_line(e)}"
    else:
        return
    sys.stdout.flush()
    print(f"{PROG}: {msg}", file=sys.stderr)
    sys.exit(code)


top()
