#!/usr/bin/env python3
"""The importer folds what exporters compute from shapes, as ONNX would.

TorchScript and Optimum exports build position ids, masks and Reshape
targets from Shape, Range, comparisons, Where, Mod, Max/Min, Expand,
GatherElements and ConstantOfShape chains. With the symbolic dims bound,
every such integer tensor of a few elements must be folded to the values
ONNX's reference evaluator computes (the tool prints them with --dump-tp),
the outputs of those ops outside the op table must get their ONNX shapes,
and the float ops after them must land in a region. Before these rules, a
TorchScript GPT-2 or BERT export had 0 regions.
"""
import json
import os
import subprocess
import tempfile
import unittest

import numpy as np
import onnx
from onnx import TensorProto, helper as h
from onnx.reference import ReferenceEvaluator

import mo_testlib
from mo_testlib import const, vi

CLI = None
I64 = TensorProto.INT64
B, S, H = 2, 6, 8


def chain_model():
    """X [batch, seq, H] with the integer chains of a TorchScript export
    around it; every integer tensor is also a graph output, so the reference
    evaluator gives its values."""
    n = h.make_node
    nodes = [
        n("Shape", ["X"], ["shape"]),
        n("Gather", ["shape", "one"], ["seq"], axis=0),
        n("Gather", ["shape", "zero"], ["batch"], axis=0),
        n("Range", ["zero", "seq", "one"], ["pos"]),                # [S]
        n("Unsqueeze", ["pos", "axes0"], ["pos2"]),                 # [1, S]
        n("Unsqueeze", ["batch", "axes0"], ["batch_1"]),
        n("Unsqueeze", ["seq", "axes0"], ["seq_1"]),
        n("Concat", ["batch_1", "seq_1"], ["bs"], axis=0),
        n("Expand", ["pos2", "bs"], ["pos_b"]),                     # [B, S]
        n("Less", ["pos_b", "three"], ["early"]),
        n("Not", ["early"], ["late"]),
        n("Mod", ["pos_b", "four"], ["pmod"]),
        n("Max", ["pmod", "one"], ["pmax"]),
        n("Min", ["pmax", "two"], ["pmin"]),
        n("Equal", ["pmin", "two"], ["eq"]),
        n("Or", ["late", "eq"], ["either"]),
        n("And", ["late", "eq"], ["both"]),
        n("GreaterOrEqual", ["pos_b", "one"], ["ge"]),
        n("Where", ["either", "pos_b", "zero"], ["picked"]),
        n("ConstantOfShape", ["bs"], ["ones"],
          value=h.make_tensor("v", I64, [1], [1])),                 # [B, S]
        n("Add", ["ones", "picked"], ["sum"]),
        n("GatherElements", ["table", "idx"], ["ge_out"], axis=1),
        # a Reshape whose target is computed: [batch, max(seq * H, 1)]
        n("Mul", ["seq_1", "h"], ["sh"]),
        n("Max", ["sh", "one"], ["sh1"]),
        n("Concat", ["batch_1", "sh1"], ["target"], axis=0),
        n("Reshape", ["X", "target"], ["flat"], name="flatten"),
        n("MatMul", ["flat", "W"], ["Y0"], name="proj"),
        n("Mul", ["Y0", "Y0"], ["Y"], name="square"),
    ]
    ints = ["shape", "pos", "pos_b", "bs", "early", "late", "pmod", "pmax", "pmin", "eq",
            "either", "both", "ge", "picked", "ones", "sum", "ge_out", "target"]
    types = {k: TensorProto.BOOL for k in ("early", "late", "eq", "either", "both", "ge")}
    inits = [const("zero", 0, np.int64), const("one", 1, np.int64), const("two", 2, np.int64),
             const("three", 3, np.int64), const("four", 4, np.int64),
             const("axes0", [0], np.int64), const("h", [H], np.int64),
             const("table", [[10, 11, 12, 13], [20, 21, 22, 23]], np.int64),
             const("idx", [[3, 0], [1, -1]], np.int64),
             mo_testlib.rng_weight("W", [S * H, 4], 1)]
    rank1 = ("shape", "pos", "bs", "target")
    outputs = [vi("Y", ["batch", 4])] + [
        vi(k, [f"{k}_{d}" for d in range(1 if k in rank1 else 2)], types.get(k, I64))
        for k in ints]
    m = mo_testlib.model(nodes, [vi("X", ["batch", "seq", H])], outputs, inits, opset=17)
    return m, ints


class Folding(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_fold_")
        self.model, self.ints = chain_model()
        self.path = os.path.join(self.dir, "m.onnx")
        onnx.save(self.model, self.path)

    def tearDown(self):
        for f in os.listdir(self.dir):
            os.remove(os.path.join(self.dir, f))
        os.rmdir(self.dir)

    def run_cli(self, *args, dims=True):
        bind = ["--dim", f"batch={B}", "--dim", f"seq={S}"] if dims else []
        r = subprocess.run([CLI, self.path, *args, *bind],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def assert_in_regions(self, nodes, dims=True):
        """Every node named is in a region of --list-regions."""
        j = json.loads(self.run_cli("--list-regions", "--json", dims=dims))
        inside = {node for g in j["regions"] for node in g["nodes"]}
        self.assertLessEqual(set(nodes), inside, j)

    def test_integer_chains_fold_to_the_reference_values(self):
        tp = json.loads(self.run_cli("--dump-tp"))
        tensors = {t["name"]: t for t in tp["tensors"]}
        x = np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)
        ref = ReferenceEvaluator(self.model).run(None, {"X": x})
        names = [o.name for o in self.model.graph.output]
        for name in self.ints:
            want = np.asarray(ref[names.index(name)])
            t = tensors[name]
            self.assertEqual(t["shape"], list(want.shape), name)
            self.assertIn("values", t, f"{name} was not folded")
            self.assertEqual(t["values"], [int(v) for v in want.reshape(-1)], name)
            self.assertEqual(t["kind"], "constant", name)

    def test_the_float_ops_after_them_land_in_a_region(self):
        self.assert_in_regions({"proj", "square"})

    def test_long_ranges_get_their_shape_without_being_folded(self):
        # Range over 1000 positions: too long to fold, its shape is still known
        n = h.make_node
        m = mo_testlib.model(
            [n("Shape", ["X"], ["shape"]),
             n("Gather", ["shape", "one"], ["seq"], axis=0),
             n("Range", ["zero", "seq", "one"], ["pos"]),
             n("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
             n("Mul", ["posf", "posf"], ["sq"]),
             n("Add", ["X", "sq"], ["Y"])],
            [vi("X", [1, "seq"])], [vi("Y", [1, "seq"])],
            [const("zero", 0, np.int64), const("one", 1, np.int64)], opset=17)
        onnx.save(m, self.path)
        r = subprocess.run([CLI, self.path, "--dump-tp", "--dim", "seq=1000"],
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        t = {t["name"]: t for t in json.loads(r.stdout)["tensors"]}
        self.assertEqual(t["pos"]["shape"], [1000])
        self.assertNotIn("values", t["pos"])
        self.assertEqual(t["Y"]["shape"], [1, 1000])

    def test_float_constants_fold_in_their_type(self):
        """A scale 1/sqrt(head size) computed from a shape and an exponent
        given as CastLike(2.0, x), in fp16: folded (as ONNX Runtime's constant
        folding does) to the values the reference evaluator gives in fp16,
        and the ops they feed land in a region (Pow with a constant
        exponent)."""
        n = h.make_node
        F16 = TensorProto.FLOAT16
        m = mo_testlib.model(
            [n("Shape", ["X"], ["shape"]),
             n("Gather", ["shape", "two_i"], ["hs"], axis=0),
             n("Cast", ["hs"], ["hsf"], to=F16),
             n("Sqrt", ["hsf"], ["root"]),
             n("Reciprocal", ["root"], ["scale"]),
             n("Div", ["third", "root"], ["odd"]),
             n("CastLike", ["two_d", "X"], ["two"]),
             n("Pow", ["X", "two"], ["sq"], name="pow"),
             n("Mul", ["sq", "scale"], ["Y0"], name="scale_it"),
             n("Add", ["Y0", "odd"], ["Y"], name="shift")],
            [vi("X", ["batch", "seq", H], F16)],
            [vi("Y", ["batch", "seq", H], F16)] +
            [vi(k, [], F16) for k in ("scale", "odd", "two")],
            [const("two_i", 2, np.int64), const("two_d", 2.0, np.float64),
             const("third", np.float16(1 / 3), np.float16)], opset=17)
        onnx.save(m, self.path)
        tp = json.loads(self.run_cli("--dump-tp"))
        tensors = {t["name"]: t for t in tp["tensors"]}
        x = np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float16)
        ref = ReferenceEvaluator(m).run(None, {"X": x})
        for k, name in enumerate(("scale", "odd", "two"), start=1):
            self.assertEqual(tensors[name]["kind"], "constant", name)
            self.assertEqual(tensors[name]["values"], [float(ref[k])], name)
        self.assert_in_regions({"pow", "scale_it", "shift"})

    def test_pad_gives_its_output_shape(self):
        """Pad is outside the op table; its output shape (pads from a
        constant, axes at opset 18) is ONNX's, so
        the MatMul after it lands in a region."""
        n = h.make_node
        m = mo_testlib.model(
            [n("Pad", ["X", "pads", "", "axes"], ["P"]),
             n("MatMul", ["P", "W"], ["Y0"], name="proj"),
             n("Mul", ["Y0", "Y0"], ["Y"], name="square")],
            [vi("X", ["batch", "seq", H])], [vi("Y", ["batch", "seq2", 4])],
            [const("pads", [1, 2, 0, 1], np.int64), const("axes", [1, -1], np.int64),
             mo_testlib.rng_weight("W", [H + 3, 4], 1)], opset=18)
        onnx.save(m, self.path)
        tensors = {t["name"]: t for t in json.loads(self.run_cli("--dump-tp"))["tensors"]}
        x = np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)
        want = ReferenceEvaluator(m).run(None, {"X": x})[0]
        self.assertEqual(tensors["P"]["shape"], [B, S + 1, H + 3])
        self.assertEqual(tensors["Y"]["shape"], list(want.shape))
        self.assert_in_regions({"proj", "square"})

    def test_torch_pad_reverses_its_pads_with_a_slice_of_step_minus_one(self):
        """torch's F.pad (MobileBERT's embeddings) exports its pads as a
        constant viewed [n, 2], reversed by a Slice of step -1, transposed
        and flattened: every step folds (a Slice of any rank and negative
        step, a Transpose), so the Pad's shape is known and the MatMul
        after it fuses. Before, nothing after the Pad had a shape, and
        MobileBERT fused nothing even with every dim bound."""
        n = h.make_node
        m = mo_testlib.model(
            [n("Reshape", ["raw", "pairs"], ["p2"]),
             n("Slice", ["p2", "start", "end", "axis0", "back"], ["rev"]),
             n("Transpose", ["rev"], ["revt"], perm=[1, 0]),
             n("Reshape", ["revt", "flat"], ["pads"]),
             n("Pad", ["X", "pads"], ["P"]),
             n("MatMul", ["P", "W"], ["Y0"], name="proj"),
             n("Mul", ["Y0", "Y0"], ["Y"], name="square")],
            [vi("X", ["batch", "seq", H])], [vi("Y", ["batch", "seq2", 4])],
            # F.pad(x, (0, 2, 1, 0)): last dim +2 at its end, seq +1 at its start
            [const("raw", [0, 2, 1, 0, 0, 0], np.int64), const("pairs", [-1, 2], np.int64),
             const("start", [-1], np.int64), const("end", [-(2 ** 62)], np.int64),
             const("axis0", [0], np.int64), const("back", [-1], np.int64),
             const("flat", [-1], np.int64), mo_testlib.rng_weight("W", [H + 2, 4], 1)],
            opset=17)
        onnx.save(m, self.path)
        tensors = {t["name"]: t for t in json.loads(self.run_cli("--dump-tp"))["tensors"]}
        x = np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)
        want = ReferenceEvaluator(m).run(None, {"X": x})[0]
        self.assertEqual(tensors["rev"]["values"], [0, 0, 1, 0, 0, 2])
        self.assertEqual(tensors["pads"]["values"], [0, 1, 0, 0, 0, 2])
        self.assertEqual(tensors["P"]["shape"], [B, S + 1, H + 2])
        self.assertEqual(tensors["Y"]["shape"], list(want.shape))
        self.assert_in_regions({"proj", "square"})

    def test_repeat_interleave_folds_through_nonzero_and_gathernd(self):
        """torch's repeat_interleave (Cohere's rotary table) exports as
        ReduceMax of the repeats, Range, Less, NonZero, Transpose and a
        GatherND: the integer steps fold (ReduceMax, NonZero of a constant
        with its shape, Transpose), GatherND gets ONNX's shape, and the
        MatMul after it fuses. Before, everything after it had an unknown
        shape: Cohere fused 0% of its MatMul FLOPs with dims unbound."""
        n = h.make_node
        m = mo_testlib.model(
            [n("ReduceMax", ["reps"], ["most"], keepdims=0),
             n("Range", ["zero", "most", "one"], ["ar"]),
             n("Less", ["ar", "reps_col"], ["take"]),
             n("NonZero", ["take"], ["nz"]),
             n("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             n("Unsqueeze", ["X", "axis1"], ["x1"]),
             n("Expand", ["x1", "wide"], ["xe"]),
             n("GatherND", ["xe", "idx"], ["rep"]),
             n("MatMul", ["rep", "W"], ["Y0"], name="proj"),
             n("Mul", ["Y0", "Y0"], ["Y"], name="square")],
            [vi("X", [3, H])], [vi("Y", [5, 4])],
            [const("reps", [2, 1, 2], np.int64), const("reps_col", [[2], [1], [2]], np.int64),
             const("zero", 0, np.int64), const("one", 1, np.int64),
             const("axis1", [1], np.int64), const("wide", [3, 2, H], np.int64),
             mo_testlib.rng_weight("W", [H, 4], 1)], opset=17)
        onnx.save(m, self.path)
        tp = json.loads(self.run_cli("--dump-tp", dims=False))
        tensors = {t["name"]: t for t in tp["tensors"]}
        x = np.random.default_rng(0).standard_normal((3, H)).astype(np.float32)
        want = ReferenceEvaluator(m).run(None, {"X": x})[0]
        self.assertEqual(tensors["most"]["values"], [2])
        self.assertEqual(tensors["nz"]["shape"], [2, 5])
        self.assertEqual(tensors["nz"]["values"], [0, 0, 1, 2, 2, 0, 1, 0, 0, 1])
        self.assertEqual(tensors["idx"]["values"], [0, 0, 0, 1, 1, 0, 2, 0, 2, 1])
        self.assertEqual(tensors["rep"]["shape"], [5, H])
        self.assertEqual(tensors["Y"]["shape"], list(want.shape))
        self.assert_in_regions({"proj", "square"}, dims=False)

    def test_repeat_interleave_at_head_dim_128_folds_past_the_small_limit(self):
        """The same chain as Helium and Cohere export it for a rotary table
        of head dim 128 (the repeats a ConstantOfShape of half the table's
        width, from its Shape): Less makes 128 booleans and NonZero 256
        indices, more than the 64 values other integer tensors fold to.
        Tensors that reach a NonZero or a GatherND's indices fold up to
        4096 values: before, NonZero stayed unfolded, GatherND's shape
        unknown, and at head dim 80 or 128 Helium and Cohere fused 0% of
        their MatMul FLOPs."""
        half, seq = 64, 5
        n = h.make_node
        m = mo_testlib.model(
            [n("Shape", ["X"], ["xs"]),
             n("Gather", ["xs", "one"], ["width"], axis=0),
             n("Unsqueeze", ["width", "axes0"], ["width1"]),
             n("ConstantOfShape", ["width1"], ["reps"],
               value=h.make_tensor("v", I64, [1], [2])),
             n("ReduceMax", ["reps"], ["most"], keepdims=0),
             n("Range", ["zero", "most", "one"], ["ar"]),
             n("Unsqueeze", ["reps", "axes1"], ["reps_col"]),
             n("Less", ["ar", "reps_col"], ["take"]),
             n("NonZero", ["take"], ["nz"]),
             n("Transpose", ["nz"], ["idx"], perm=[1, 0]),
             n("Transpose", ["X"], ["xt"], perm=[1, 0]),
             n("Unsqueeze", ["xt", "axes1"], ["x1"]),
             n("Expand", ["x1", "wide"], ["xe"]),
             n("GatherND", ["xe", "idx"], ["rep"]),
             n("Transpose", ["rep"], ["table"], perm=[1, 0]),
             n("MatMul", ["table", "W"], ["Y0"], name="proj"),
             n("Mul", ["Y0", "Y0"], ["Y"], name="square")],
            [vi("X", [seq, half])], [vi("Y", [seq, 4])],
            [const("zero", 0, np.int64), const("one", 1, np.int64),
             const("axes0", [0], np.int64), const("axes1", [1], np.int64),
             const("wide", [half, 2, seq], np.int64),
             mo_testlib.rng_weight("W", [2 * half, 4], 1)], opset=17)
        onnx.save(m, self.path)
        tensors = {t["name"]: t for t in
                   json.loads(self.run_cli("--dump-tp", dims=False))["tensors"]}
        take = np.ones((half, 2), bool)
        self.assertEqual(tensors["take"]["values"], [1] * (2 * half))
        self.assertEqual(tensors["nz"]["shape"], [2, 2 * half])
        self.assertEqual(tensors["nz"]["values"], np.stack(np.nonzero(take)).reshape(-1).tolist())
        self.assertEqual(tensors["idx"]["shape"], [2 * half, 2])
        self.assertEqual(tensors["rep"]["shape"], [2 * half, seq])
        self.assertEqual(tensors["Y"]["shape"], [seq, 4])
        self.assert_in_regions({"proj", "square"}, dims=False)
        # and the fused model computes the interleaved table as ONNX does
        out = os.path.join(self.dir, "fused.onnx")
        r = subprocess.run([CLI, self.path, "-o", out, "--no-cuda", "--budget", "2", "-q",
                            "--cpu-kernels"], capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stderr)
        fused = onnx.load(out)
        self.assertTrue(any(nd.domain.startswith("mirage_onnx") for nd in fused.graph.node),
                        [nd.op_type for nd in fused.graph.node])
        x = np.random.default_rng(0).standard_normal((seq, half)).astype(np.float32)
        want = ReferenceEvaluator(m).run(None, {"X": x})[0]
        got = mo_testlib.run_fused(out, {"X": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    def test_scatters_and_tile_give_their_output_shape(self):
        """ScatterND, ScatterElements and Tile are outside the op table;
        a scatter's output has its data's shape (OPT's causal mask is a
        ScatterND: without its shape, every attention and MLP after it had
        "an input's shape is unknown"), Tile's each dim times its repeat
        (GPT-J's rotary table, repeated per batch element), so the MatMuls
        after them land in regions."""
        n = h.make_node
        m = mo_testlib.model(
            [n("ScatterND", ["X", "idx", "upd"], ["P"], name="scatter_nd"),
             n("Tile", ["P", "reps"], ["T"], name="tile"),
             n("MatMul", ["T", "W"], ["Y0"], name="proj"),
             n("Mul", ["Y0", "Y0"], ["Y1"], name="square"),
             n("ScatterElements", ["Y1", "eidx", "eupd"], ["Q"], axis=2, name="scatter_el"),
             n("MatMul", ["Q", "W2"], ["Y2"], name="proj2"),
             n("Mul", ["Y2", "Y2"], ["Y"], name="square2")],
            [vi("X", ["batch", "seq", H])], [vi("Y", ["batch", "seq", 4])],
            [const("idx", [[0]], np.int64), const("upd", np.ones((1, S, H)), np.float32),
             const("eidx", np.zeros((1, 1, 1)), np.int64),
             const("eupd", np.ones((1, 1, 1)), np.float32),
             const("reps", [1, 1, 2], np.int64),
             mo_testlib.rng_weight("W", [2 * H, 4], 1), mo_testlib.rng_weight("W2", [4, 4], 2)],
            opset=17)
        onnx.save(m, self.path)
        tensors = {t["name"]: t for t in json.loads(self.run_cli("--dump-tp"))["tensors"]}
        x = np.random.default_rng(0).standard_normal((B, S, H)).astype(np.float32)
        want = ReferenceEvaluator(m).run(None, {"X": x})[0]
        self.assertEqual(tensors["P"]["shape"], [B, S, H])
        self.assertEqual(tensors["T"]["shape"], [B, S, 2 * H])
        self.assertEqual(tensors["Q"]["shape"], [B, S, 4])
        self.assertEqual(tensors["Y"]["shape"], list(want.shape))
        self.assert_in_regions({"proj", "square", "proj2", "square2"})

    def test_conv_and_pools_give_their_output_shape(self):
        """Conv and the pools are outside the op table; their output shape
        is ONNX's rule (a ViT's patch embedding is a Conv: without it,
        nothing after it had a shape and a ViT export fused nothing):
        explicit pads, strides and dilations, auto_pad SAME_UPPER and
        VALID, a pool's ceil_mode, a global pool, a grouped Conv. The
        MatMul after them lands in a region."""
        n = h.make_node
        rng = np.random.default_rng(3)
        m = mo_testlib.model(
            [n("Conv", ["X", "W1"], ["C1"], strides=[2, 1], pads=[1, 0, 1, 2],
               dilations=[1, 2], name="conv"),
             n("Conv", ["C1", "W2", "B2"], ["C2"], auto_pad="SAME_UPPER", strides=[2, 2],
               group=2, name="conv_grouped"),
             n("MaxPool", ["C2"], ["P1"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1,
               name="pool"),
             n("AveragePool", ["C1"], ["P2"], kernel_shape=[3, 3], auto_pad="VALID",
               name="avg"),
             n("GlobalAveragePool", ["C2"], ["G"], name="gap"),
             n("MatMul", ["P1", "W3"], ["Y0"], name="proj"),
             n("Mul", ["Y0", "Y0"], ["Y"], name="square")],
            [vi("X", ["batch", 3, 9, "seq"])], [vi("Y", ["batch", 4, "y2", 5]),
                                                vi("P2", ["batch", 4, "p2", "p3"]),
                                                vi("G", ["batch", 4, 1, 1])],
            [const("W1", rng.standard_normal((4, 3, 3, 3))),
             const("W2", rng.standard_normal((4, 2, 3, 3))),
             const("B2", rng.standard_normal(4)),
             const("W3", rng.standard_normal((1, 5)))], opset=17)
        onnx.save(m, self.path)
        tensors = {t["name"]: t for t in json.loads(self.run_cli("--dump-tp"))["tensors"]}
        x = rng.standard_normal((B, 3, 9, S)).astype(np.float32)
        names = ["C1", "C2", "P1", "P2", "G", "Y"]
        want = ReferenceEvaluator(m).run(names, {"X": x})
        for name, w in zip(names, want):
            self.assertEqual(tensors[name]["shape"], list(w.shape), name)
        self.assert_in_regions({"proj", "square"})
        # a binding the weights contradict: said, not a silent "0 regions"
        bad = subprocess.run([CLI, self.path, "--list-regions"], capture_output=True,
                             text=True, timeout=300)
        self.assertEqual(bad.returncode, 0, bad.stderr)
        m.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "channels"
        onnx.save(m, self.path)
        r = subprocess.run([CLI, self.path, "--list-regions", "--dim", f"batch={B}",
                            "--dim", f"seq={S}", "--dim", "channels=5"],
                           capture_output=True, text=True, timeout=300)
        self.assertIn("node 'conv' (Conv): its input has 5 channels, its weight takes 3",
                      r.stderr)

    def test_a_shape_read_outside_does_not_make_the_fused_op_output_its_tensor(self):
        """Shape(T) of a tensor a fused op keeps inside, read by a Reshape
        outside: with the dims bound the Shape is folded whole, so the fused
        op does not write T for it (GQA's expanded K in an Optimum export),
        and the fused model holds the shape as an initializer."""
        from fuse_models_test import fileset, session
        n = h.make_node
        m = mo_testlib.model(
            [n("MatMul", ["X", "W"], ["T"], name="proj"),
             n("Mul", ["T", "T"], ["Y"], name="square"),
             n("Shape", ["T"], ["shape"], name="shape"),
             n("Reshape", ["Z", "shape"], ["Zr"], name="view")],
            [vi("X", ["batch", "seq", H]), vi("Z", ["batch", "seq", 4])],
            [vi("Y", ["batch", "seq", 4]), vi("Zr", ["batch", "seq", 4])],
            [mo_testlib.rng_weight("W", [H, 4], 3)], opset=18)
        onnx.save(m, self.path)
        out = os.path.join(self.dir, "f.onnx")
        self.run_cli("-o", out, "--no-cuda", "--cpu-kernels", "--no-cache", "--budget", "3",
                     "--min-saving", "0")
        fused = onnx.load(out)
        mine = [x for x in fused.graph.node if x.domain.startswith("mirage_onnx")]
        self.assertEqual(len(mine), 1, [x.op_type for x in fused.graph.node])
        self.assertEqual(list(mine[0].output), ["Y"])
        self.assertNotIn("Shape", [x.op_type for x in fused.graph.node])
        init = {i.name: onnx.numpy_helper.to_array(i) for i in fused.graph.initializer}
        self.assertEqual(init["shape"].tolist(), [B, S, 4])
        rng = np.random.default_rng(1)
        feed = {"X": rng.standard_normal((B, S, H)).astype(np.float32),
                "Z": rng.standard_normal((B, S, 4)).astype(np.float32)}
        plugin, _ = fileset(out)
        for want, got in zip(session(self.path).run(None, feed),
                             session(out, plugin).run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # the runtime without the plugin runs the function body
        for want, got in zip(session(self.path).run(None, feed), session(out).run(None, feed)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for f in os.listdir(self.dir):
            if f.startswith("f."):
                os.remove(os.path.join(self.dir, f))

    def test_an_empty_slice_adds_nothing_to_a_concat(self):
        """A partial rotary embedding whose rotary dims are the head's whole
        (Phi-3): `q[..., 16:]` of 16 is empty, and Concat(rotated, empty)
        is the rotated part. The importer folds the empty Slice and the
        Concat drops it, so the Concat and the projection after it join the
        region: one fused op, nothing else left. Before, the Concat of an
        empty tensor split the region and only Slice·Mul was a candidate."""
        from fuse_models_test import fileset, session
        n = h.make_node
        m = mo_testlib.model(
            [n("Slice", ["Q", "s0", "s16", "ax"], ["rot"], name="rot"),
             n("Slice", ["Q", "s16", "big", "ax"], ["pass"], name="pass"),
             n("Mul", ["rot", "C"], ["e"], name="embed"),
             n("Concat", ["e", "pass"], ["qe"], axis=-1, name="join"),
             n("MatMul", ["qe", "W"], ["Y"], name="proj")],
            [vi("Q", ["batch", 2, "seq", 16]), vi("C", ["seq", 16])],
            [vi("Y", ["batch", 2, "seq", 16])],
            [const(k, [v], np.int64) for k, v in (("s0", 0), ("s16", 16), ("big", 2 ** 62),
                                                  ("ax", -1))] +
            [mo_testlib.rng_weight("W", [16, 16], 5)], opset=18)
        onnx.save(m, self.path)
        out = os.path.join(self.dir, "f.onnx")
        self.run_cli("-o", out, "--no-cuda", "--cpu-kernels", "--no-cache", "--budget", "5",
                     "--min-saving", "0")
        fused = onnx.load(out)
        self.assertEqual([x.domain.startswith("mirage_onnx") for x in fused.graph.node], [True],
                         [x.op_type for x in fused.graph.node])
        rng = np.random.default_rng(2)
        feed = {"Q": rng.standard_normal((B, 2, S, 16)).astype(np.float32),
                "C": rng.standard_normal((S, 16)).astype(np.float32)}
        plugin, _ = fileset(out)
        want = session(self.path).run(None, feed)
        for got in (session(out, plugin).run(None, feed), session(out).run(None, feed)):
            np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        for f in os.listdir(self.dir):
            if f.startswith("f."):
                os.remove(os.path.join(self.dir, f))


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), paths=("cli",), verbosity=1)
