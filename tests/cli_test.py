#!/usr/bin/env python3
"""End-to-end tests of the mirage-onnx command line.

Every bad input gets one line on stderr naming the problem, exit code 1, no
output file and an untouched input; usage errors exit 2; a good model is
summarized and written unchanged, external data included.
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import mo_testlib

CLI = None
IR_VERSION = 8  # what ONNX Runtime reads, whatever the onnx package writes


def read(path):
    with open(path, "rb") as f:
        return f.read()


def matmul_model(w=None):
    """Y = X · W with W (4, 3) as an initializer."""
    if w is None:
        w = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm")],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(w, "W")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             producer_name="cli_test", ir_version=IR_VERSION)


def raw_model(nodes, inputs=("x",), outputs=("y",)):
    """A model built without ONNX's checker, so it may be malformed."""
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [4])
    graph = helper.make_graph(nodes, "g", [vi(n) for n in inputs], [vi(n) for n in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=IR_VERSION)


def external_model(folder, location, offset, length):
    """A MatMul model whose weight W (48 bytes) is external data."""
    with open(os.path.join(folder, "weights.bin"), "wb") as f:
        f.write(np.arange(12, dtype=np.float32).tobytes())
    m = matmul_model()
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", offset), ("length", length)):
        if v is not None:
            e = w.external_data.add()
            e.key, e.value = k, str(v)
    return m


class Cli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_cli_")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def run_cli(self, *args, env=None):
        return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600,
                              env=env)

    def write(self, name, data):
        p = self.path(name)
        with open(p, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.SerializeToString())
        return p

    def listing(self):
        out = []
        for root, dirs, files in os.walk(self.dir):
            out += [os.path.relpath(os.path.join(root, f), self.dir) for f in files]
        return sorted(out)

    def assert_bad_input(self, model, needle, out=None):
        """Exit 1, one line naming the problem, nothing written, input kept."""
        out = out or self.path("out.onnx")
        before = self.listing()
        original = read(model) if os.path.isfile(model) else None
        r = self.run_cli(model, "-o", out)
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("mirage-onnx: error: "), lines[0])
        self.assertIn(needle, lines[0])
        self.assertEqual(self.listing(), before, "files appeared or vanished")
        if original is not None:
            self.assertEqual(read(model), original, "input changed")

    # ---- bad input ----

    def test_missing_file(self):
        self.assert_bad_input(self.path("nope.onnx"), "No such file")

    def test_folder(self):
        os.mkdir(self.path("folder.onnx"))
        self.assert_bad_input(self.path("folder.onnx"), "is a folder")

    def test_empty_file(self):
        self.assert_bad_input(self.write("empty.onnx", b""), "empty")

    def test_truncated_protobuf(self):
        data = matmul_model().SerializeToString()
        for cut in (len(data) // 3, len(data) // 2, len(data) - 5):
            with self.subTest(cut=cut):
                self.assert_bad_input(self.write("cut.onnx", data[:cut]), "truncated")

    def test_random_bytes(self):
        rng = np.random.default_rng(1)
        for i in range(5):
            with self.subTest(i=i):
                data = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
                self.assert_bad_input(self.write("rand.onnx", data), "not a")

    def test_protobuf_that_is_not_a_model(self):
        t = numpy_helper.from_array(np.ones((3, 3), np.float32), "t")
        self.assert_bad_input(self.write("tensor.onnx", t), "not an ONNX model")
        g = matmul_model().graph
        self.assert_bad_input(self.write("graph.onnx", g), "not an ONNX model")

    def test_cycle(self):
        m = raw_model([helper.make_node("Add", ["x", "c"], ["b"], name="n1"),
                       helper.make_node("Relu", ["b"], ["c"], name="n2")], outputs=["c"])
        self.assert_bad_input(self.write("cycle.onnx", m), "cycle")

    def test_dangling_input(self):
        m = raw_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")])
        self.assert_bad_input(self.write("dangling.onnx", m), "'ghost'")

    def test_duplicate_output_name(self):
        m = raw_model([helper.make_node("Relu", ["x"], ["y"], name="a"),
                       helper.make_node("Neg", ["x"], ["y"], name="b")])
        self.assert_bad_input(self.write("dup.onnx", m), "defined twice")

    def test_dangling_name_in_subgraph(self):
        branch = lambda src: helper.make_graph(
            [helper.make_node("Relu", [src], ["o"])], "b", [],
            [helper.make_tensor_value_info("o", TensorProto.FLOAT, [4])])
        node = helper.make_node("If", ["cond"], ["y"], name="if",
                                then_branch=branch("x"), else_branch=branch("ghost"))
        m = raw_model([node], inputs=("x", "cond"))
        self.assert_bad_input(self.write("sub.onnx", m), "else_branch")

    def test_external_data_outside_the_folder(self):
        os.mkdir(self.path("inner"))
        m = external_model(self.dir, "../weights.bin", 0, 48)
        self.assert_bad_input(self.write("inner/model.onnx", m), "outside the model's folder",
                              out=self.path("inner", "out.onnx"))
        m = external_model(self.dir, "/etc/passwd", 0, 48)
        self.assert_bad_input(self.write("abs.onnx", m), "outside the model's folder")

    def test_external_data_past_the_end(self):
        m = external_model(self.dir, "weights.bin", 16, 48)
        self.assert_bad_input(self.write("past.onnx", m), "past the end")
        m = external_model(self.dir, "weights.bin", 4096, None)
        self.assert_bad_input(self.write("past2.onnx", m), "past the end")

    def test_output_in_a_missing_folder(self):
        model = self.write("m.onnx", matmul_model())
        self.assert_bad_input(model, "does not exist", out=self.path("no", "such", "o.onnx"))

    def test_output_is_the_input(self):
        model = self.write("m.onnx", matmul_model())
        self.assert_bad_input(model, "output is the input", out=model)
        self.assert_bad_input(model, "output is the input",
                              out=os.path.join(self.dir, ".", "m.onnx"))
        os.symlink(model, self.path("link.onnx"))
        self.assert_bad_input(model, "output is the input", out=self.path("link.onnx"))

    def test_output_is_a_folder(self):
        model = self.write("m.onnx", matmul_model())
        os.mkdir(self.path("outdir"))
        self.assert_bad_input(model, "is a folder", out=self.path("outdir"))

    def test_output_is_a_pipe_or_a_socket(self):
        # the rename into place would replace a device (-o /dev/null run as
        # root once left /dev/null a regular file), a pipe or a socket: each
        # is refused before any work, and stays what it was; --dot too
        import socket
        import stat
        model = self.write("m.onnx", matmul_model())
        fifo = self.path("fifo")
        os.mkfifo(fifo)
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        sock.bind(self.path("sock"))
        for out, kind in ((fifo, "a named pipe"), (self.path("sock"), "a socket")):
            self.assert_bad_input(model, "not a regular file (%s)" % kind, out=out)
            before = self.listing()
            r = self.run_cli(model, "--list-regions", "--dot", out)
            self.assertEqual(r.returncode, 1, r.stderr)
            self.assertIn("not a regular file", r.stderr)
            self.assertEqual(self.listing(), before)
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))
        self.assertTrue(stat.S_ISSOCK(os.lstat(self.path("sock")).st_mode))
        # a symlink to a device is replaced, never written through
        link = self.path("link.onnx")
        os.symlink(fifo, link)
        r = self.run_cli(model, "-o", link, "--no-fuse", "-q")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertFalse(os.path.islink(link))
        self.assertTrue(stat.S_ISFIFO(os.lstat(fifo).st_mode))

    def test_an_unusable_result_cache_is_said_and_the_run_goes_on(self):
        # a cache that is a file, or a folder that cannot be made, once
        # went unused without a word (every search ran again, every run)
        model = self.write("m.onnx", matmul_model())
        self.write("cache-file", b"")
        for cache, why in ((self.path("cache-file"), "not a folder"),
                           (self.path("cache-file", "sub"), "Not a directory")):
            out = self.path("out.onnx")
            env = dict(os.environ, MIRAGE_ONNX_CACHE=cache)
            r = self.run_cli(model, "-o", out, "-q", "--no-cuda", "--budget", "2", env=env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertTrue(os.path.isfile(out))
            warned = [ln for ln in r.stderr.splitlines() if "result cache" in ln]
            self.assertEqual(len(warned), 1, r.stderr)
            self.assertIn("'%s' cannot be used (%s)" % (cache, why), warned[0])
            self.assertTrue(os.path.isfile(self.path("cache-file")))
            r = self.run_cli(model, "-o", out, "-q", "--no-cuda", "--no-cache", env=env)
            self.assertNotIn("result cache", r.stderr)

    def test_absurd_declared_shape(self):
        m = raw_model([helper.make_node("Relu", ["x"], ["y"])])
        m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1 << 50
        model = self.write("huge.onnx", m)
        r = self.run_cli(model, "--list-regions")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1)
        self.assertIn("absurd shape", r.stderr)

    # ---- regions ----

    def rmsnorm_model(self, batch):
        """RMSNorm + MatMul with unnamed nodes and a symbolic batch dim."""
        w = numpy_helper.from_array(np.ones((8, 4), np.float32), "W")
        g = numpy_helper.from_array(np.ones(8, np.float32), "G")
        two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
        eps = numpy_helper.from_array(np.array(1e-6, np.float32), "eps")
        nodes = [helper.make_node("Pow", ["X", "two"], ["sq"]),
                 helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1]),
                 helper.make_node("Add", ["ms", "eps"], ["mse"]),
                 helper.make_node("Sqrt", ["mse"], ["rms"]),
                 helper.make_node("Div", ["X", "rms"], ["n"]),
                 helper.make_node("Mul", ["n", "G"], ["ng"]),
                 helper.make_node("MatMul", ["ng", "W"], ["Y"])]
        graph = helper.make_graph(
            nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, 8])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, 4])], [w, g, two, eps])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                                 ir_version=IR_VERSION)

    def regions(self, *args):
        r = self.run_cli(*args, "--list-regions", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout), r.stderr

    def test_symbolic_dims_are_bound_with_dim(self):
        model = self.write("sym.onnx", self.rmsnorm_model("batch"))
        # unbound: left symbolic, the region listed at the size searched at
        # (batch 1), its kernel serving any batch; --dim binds it instead
        doc, err = self.regions(model)
        self.assertEqual(len(doc["regions"]), 1)
        self.assertEqual(doc["regions"][0]["input_types"]["X"]["shape"], [1, 8])
        self.assertIn("--dim batch=N", err)
        doc, err = self.regions(model, "--dim", "batch=3")
        self.assertEqual(err, "")
        self.assertEqual(len(doc["regions"]), 1)
        self.assertEqual(doc["regions"][0]["input_types"]["X"]["shape"], [3, 8])
        doc, _ = self.regions(model, "--input-shape", "X=5x8")
        self.assertEqual(doc["regions"][0]["output_types"]["Y"]["shape"], [5, 4])
        for bad in (["--dim", "batch"], ["--dim", "batch=-1"], ["--input-shape", "X=2xq"],
                    ["--input-shape", "nope=2x8"]):
            with self.subTest(bad=bad):
                r = self.run_cli(model, "--list-regions", *bad)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1)

    def test_unnamed_nodes_get_stable_names_everywhere(self):
        model = self.write("unnamed.onnx", self.rmsnorm_model(2))
        doc, _ = self.regions(model)
        names = doc["regions"][0]["nodes"]
        self.assertEqual(names, ["Pow_0", "ReduceMean_1", "Add_2", "Sqrt_3", "Div_4",
                                 "Mul_5", "MatMul_6"])
        self.assertEqual(self.regions(model)[0], doc)  # the same on every run
        text = self.run_cli(model, "--list-regions").stdout
        dot = self.path("g.dot")
        self.assertEqual(self.run_cli(model, "-q", "--dot", dot).returncode, 0)
        with open(dot) as f:
            dot_text = f.read()
        for n in names:
            self.assertIn(n, text)
            self.assertIn(n, dot_text)

    # ---- search ----

    def test_search_only_json_and_cache(self):
        """--search-only finds one graph-defined kernel for RMSNorm + MatMul,
        reports it as JSON, stores it in the cache and re-verifies it there."""
        model = self.write("rms.onnx", self.rmsnorm_model(4))
        env = dict(os.environ, MIRAGE_ONNX_CACHE=self.path("cache"))
        args = [model, "--search-only", "--json", "--budget", "300", "--seed", "3"]
        r = self.run_cli(*args, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        (region,) = doc["regions"]
        self.assertTrue(region["fused"], region)
        self.assertEqual(region["kernels"], 1)
        self.assertEqual(region["graph_defined_kernels"], 1)
        self.assertFalse(region["cached"])
        for key in ("search_seconds", "states", "verified", "pruned_absexpr", "grid",
                    "forloop", "cost_us", "unfused_cost_us", "error_bound"):
            self.assertIn(key, region)
        self.assertGreater(region["states"], 0)
        self.assertLess(region["error_bound"], 1e-20)
        self.assertEqual(len(os.listdir(self.path("cache"))), 1)
        again = json.loads(self.run_cli(*args, env=env).stdout)["regions"][0]
        self.assertTrue(again["cached"])
        self.assertEqual(again["kernels"], 1)
        # a corrupted cache entry is not trusted: the search runs again
        (entry,) = os.listdir(self.path("cache"))
        with open(os.path.join(self.path("cache"), entry), "w") as f:
            f.write('{"steps": []}')
        third = json.loads(self.run_cli(*args, env=env).stdout)["regions"][0]
        self.assertFalse(third["cached"])
        self.assertTrue(third["fused"])
        dump = self.path("dump")
        # a missing folder is said at once, before any search
        r = self.run_cli(*args, "--no-cache", "--dump-mugraph", dump, env=env)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
        self.assertIn("--dump-mugraph", r.stderr)
        os.mkdir(dump)
        r = self.run_cli(*args, "--no-cache", "--dump-mugraph", dump, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.listdir(dump), ["region_1.json"])
        # fusing writes the same file for what it fuses (here from the cache)
        os.remove(os.path.join(dump, "region_1.json"))
        r = self.run_cli(model, "-q", "-o", self.path("fused.onnx"), "--no-cuda",
                         "--dump-mugraph", dump, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(os.listdir(dump), ["region_1.json"])
        with open(os.path.join(dump, "region_1.json")) as f:
            self.assertIn("steps", json.load(f))

    def test_keep_sources_without_cuda_keeps_the_cuda_source(self):
        """--keep-sources with --no-cuda still writes each op's .cu (what the
        CUDA execution layer runs), uncompiled, and where nvcc is it is the
        very text a CUDA build compiles."""
        model = self.write("rms.onnx", self.rmsnorm_model(4))
        env = dict(os.environ, MIRAGE_ONNX_CACHE=self.path("cache"))
        kept = self.path("kept")
        r = self.run_cli(model, "-q", "-o", self.path("cpu.onnx"), "--no-cuda",
                         "--keep-sources", kept, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("mo_op0.cu", os.listdir(kept))
        self.assertNotIn("mo_op0.cu.o", os.listdir(kept))
        with open(os.path.join(kept, "mo_op0.cu")) as f:
            self.assertIn("__global__", f.read())
        if not (shutil.which("nvcc") or os.access("/usr/local/cuda/bin/nvcc", os.X_OK)):
            return
        built = self.path("built")
        r = self.run_cli(model, "-q", "-o", self.path("gpu.onnx"), "--keep-sources", built,
                         env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("mo_op0.cu.o", os.listdir(built))
        self.assertEqual(read(os.path.join(kept, "mo_op0.cu")),
                         read(os.path.join(built, "mo_op0.cu")))

    def test_a_region_that_cannot_be_searched_stays_unfused(self):
        """A NaN weight has no field value: that region's search fails, the
        run goes on and says why (it used to end the whole run)."""
        m = self.rmsnorm_model(4)
        w = np.ones((8, 4), np.float32)
        w[0, 0] = np.nan
        for t in m.graph.initializer:
            if t.name == "W":
                t.CopyFrom(numpy_helper.from_array(w, "W"))
        model = self.write("nan.onnx", m)
        r = self.run_cli(model, "--search-only", "--json", "--no-cache")
        self.assertEqual(r.returncode, 0, r.stderr)
        (region,) = json.loads(r.stdout)["regions"]
        self.assertFalse(region["fused"])
        self.assertIn("not finite", region["why"])

    def test_search_flags_are_checked(self):
        model = self.write("m.onnx", matmul_model())
        for bad in (["--budget", "0"], ["--jobs", "x"], ["--target", "sm_70"],
                    ["--gpu", "v100"], ["--max-block-ops", "0"],
                    ["--target", "sm_80", "--gpu", "h100"]):
            with self.subTest(bad=bad):
                r = self.run_cli(model, "--search-only", *bad)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)

    def test_json_needs_list_regions(self):
        model = self.write("m.onnx", matmul_model())
        r = self.run_cli(model, "--json")
        self.assertEqual(r.returncode, 2)

    # ---- usage ----

    def test_usage_errors_exit_2(self):
        model = self.write("m.onnx", matmul_model())
        for args in ([], ["--bogus", model], [model, "-o"], [model, "other.onnx"]):
            with self.subTest(args=args):
                r = self.run_cli(*args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                self.assertIn("--help", r.stderr)

    def test_help_documents_every_flag_and_exit_code(self):
        r = self.run_cli("--help")
        self.assertEqual(r.returncode, 0)
        for flag in ("--output", "--quiet", "--help", "--version", "-o", "-q", "-h", "-V",
                     "--list-regions", "--json", "--dot", "--dump-tp", "--dim",
                     "--input-shape", "--max-region-ops", "--search-only", "--budget",
                     "--jobs", "--max-kernel-ops", "--max-block-ops", "--target", "--gpu",
                     "--no-cache", "--dump-mugraph", "--seed"):
            self.assertIn(flag, r.stdout)
        for code in ("0  success", "1  bad input", "2  usage", "3  internal"):
            self.assertIn(code, r.stdout)

    def test_version(self):
        r = self.run_cli("--version")
        self.assertEqual(r.returncode, 0)
        self.assertRegex(r.stdout, r"^mirage-onnx \d+\.\d+\.\d+\n$")

    # ---- good models ----

    def test_good_model_is_summarized_and_written_unchanged(self):
        model = self.write("m.onnx", matmul_model())
        out = self.path("out.onnx")
        r = self.run_cli(model, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        for s in ("IR version", "ai.onnx 17", "cli_test", "MatMul 1",
                  "X: float32 [2, 4]", "Y: float32 [2, 3]", "48 B of weights"):
            self.assertIn(s, r.stdout)
        self.assertEqual(read(out), read(model))
        self.assertEqual(self.listing(), ["m.onnx", "out.onnx"])
        r = self.run_cli("-q", model, "-o", out)  # overwrites an existing output
        self.assertEqual((r.returncode, r.stdout), (0, ""))

    def test_external_data_model_runs_in_onnxruntime(self):
        import onnxruntime as ort
        m = external_model(self.dir, "weights.bin", 0, 48)
        model = self.write("ext.onnx", m)
        out = self.path("ext_out.onnx")
        r = self.run_cli(model, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("1 external data file", r.stdout)
        self.assertEqual(read(out), read(model))
        os.mkdir(self.path("elsewhere"))
        r = self.run_cli("-q", model, "-o", self.path("elsewhere", "o.onnx"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("warning: ", r.stderr)
        self.assertIn("'weights.bin'", r.stderr)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        s = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        y = s.run(None, {"X": x})[0]
        np.testing.assert_allclose(y, x @ np.arange(12, dtype=np.float32).reshape(4, 3))


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=1)
