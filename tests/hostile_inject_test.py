#!/usr/bin/env python3
"""What the tool writes, and where, when paths, names and the file system are
hostile.

- Text from the model's path or names reaches generated source only as data:
  a path that closes the banner comment puts no code into the plugin.
- Every file is created exclusively and renamed into place: a symlink planted
  at a temporary's or a destination's name is never written through.
- No output (OUT, its .mirage.so and .mirage.json, --dot) may be an input
  (the model, its external data), by identity, not by name.
- A signal during the build, or a failed link, leaves no temporary folder,
  temporary file or compiler process behind.
- A full disk is said as such, with exit 1, not as a linker error.
"""
import glob
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import unittest

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import mo_testlib

CLI = None
IR_VERSION = 8


def read(path):
    with open(path, "rb") as f:
        return f.read()


def rmsnorm_model(names=None, batch=4):
    """RMSNorm + MatMul: one region the search fuses into one kernel in a
    second or two. `names` renames the nodes and intermediate tensors."""
    n = names or {}
    t = lambda x: n.get(x, x)  # noqa: E731
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), t("W"))
    g = numpy_helper.from_array(np.ones(8, np.float32), t("G"))
    two = numpy_helper.from_array(np.array(2.0, np.float32), t("two"))
    eps = numpy_helper.from_array(np.array(1e-6, np.float32), t("eps"))
    nodes = [helper.make_node("Pow", [t("X"), t("two")], [t("sq")], name=t("pow")),
             helper.make_node("ReduceMean", [t("sq")], [t("ms")], axes=[-1], name=t("mean")),
             helper.make_node("Add", [t("ms"), t("eps")], [t("mse")], name=t("add")),
             helper.make_node("Sqrt", [t("mse")], [t("rms")], name=t("sqrt")),
             helper.make_node("Div", [t("X"), t("rms")], [t("n")], name=t("div")),
             helper.make_node("Mul", [t("n"), t("G")], [t("ng")], name=t("mul")),
             helper.make_node("MatMul", [t("ng"), t("W")], [t("Y")], name=t("mm"))]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(t("X"), TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info(t("Y"), TensorProto.FLOAT, [batch, 4])], [w, g, two, eps])
    graph.doc_string = "*/ int doc_injected; /*"
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                             ir_version=IR_VERSION)


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="mo_hostile_")
        # the tool's own temporaries go here, so that leftovers are seen
        self.tmp = os.path.join(self.dir, "tmp")
        os.mkdir(self.tmp)
        os.mkdir(self.path("cache"))
        self.env = dict(os.environ, TMPDIR=self.tmp, MIRAGE_ONNX_CACHE=self.path("cache"))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def path(self, *p):
        return os.path.join(self.dir, *p)

    def write_model(self, path, model=None):
        with open(path, "wb") as f:
            f.write((model or rmsnorm_model()).SerializeToString())
        return path

    def run_cli(self, *args, env=None, **kw):
        return subprocess.run([CLI, *args], capture_output=True, timeout=900,
                              env=env or self.env, **kw)

    def fuse_args(self):
        return ["-q", "--no-cuda", "--budget", "300", "--seed", "3"]

    def assert_one_error_line(self, r, code, needle):
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, code, err)
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("mirage-onnx: error: "), lines[0])
        self.assertIn(needle.lower(), lines[0].lower())


class GeneratedCodeInjection(Base):
    def test_a_model_path_that_closes_the_banner_comment_puts_no_code_in_the_plugin(self):
        """The banner of every generated source holds the model's path. A
        folder 'p*' followed by one holding C code closes the comment; the
        code (a constructor) would run when the tool loads the plugin for its
        CPU kernel check, and in every process that loads the plugin."""
        pwned = self.path("PWNED")
        evil = ('p*', ' __attribute__((constructor)) static void pwn(void) { int system(const '
                'char *); system("touch ' + pwned.replace("/", "\\057") + '"); } static int x_ ')
        # '/' in a C string written as \057: a path component holds no '/';
        # the file's name, "*m.onnx", opens a comment again after the code
        folder = os.path.join(self.dir, *evil)
        os.makedirs(folder)
        model = self.write_model(os.path.join(folder, "*m.onnx"))
        out = self.path("out.onnx")
        keep = self.path("sources")
        r = self.run_cli(model, "-o", out, *self.fuse_args(), "--keep-sources", keep)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertFalse(os.path.exists(pwned), "code from the model's path ran")
        self.assertTrue(glob.glob(self.path("out.mirage.*.so")))
        for name in ("mo_op0.c", "mo_ops.c"):
            text = read(os.path.join(keep, name))
            first = text.split(b"\n", 1)[0]
            # the banner is one comment line with the path in it as data
            self.assertTrue(first.startswith(b"/* ") and first.endswith(b" */"), first)
            self.assertEqual(first.count(b"*/"), 1, first)
            self.assertIn(b"constructor", first)

    def test_hostile_paths_and_names_are_data_in_generated_code(self):
        """Newlines, quotes, backslashes, $(...), a leading '-' and bytes
        that are not UTF-8 in the model's folder and in node and tensor
        names: the fuse succeeds, runs nothing, and the generated sources
        keep every such byte out of code."""
        pwned = self.path("PWNED2")
        folder = os.path.join(self.dir.encode(), b"-rf \n\"q\\ $(touch PWNED2) \xff\xfe *")
        os.makedirs(folder)
        names = {"X": 'x"*/\n\\', "sq": "$(touch PWNED2)", "ms": "\u00e9*/", "n": "-o",
                 "Y": "y\\\"", "pow": "*/ int p; /*", "mm": "mm\n#define x"}
        model = self.write_model(os.path.join(folder, b"m\n*.onnx"), rmsnorm_model(names))
        out = self.path("out.onnx")
        keep = self.path("sources")
        r = subprocess.run([CLI.encode(), model, b"-o", out.encode(),
                            *[a.encode() for a in self.fuse_args()], b"--keep-sources",
                            keep.encode()], capture_output=True, timeout=900, env=self.env,
                           cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr.decode(errors="replace"))
        self.assertFalse(os.path.exists(pwned))
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "PWNED2")))
        for name in os.listdir(keep):
            if not name.endswith(".c"):
                continue
            text = read(os.path.join(keep, name))
            for bad in (b"\xff", b"\n*/", b'"q\\ ', b"#define x"):
                self.assertNotIn(bad, text, name)
            first = text.split(b"\n", 1)[0]
            if first.startswith(b"/* generated"):
                self.assertEqual(first.count(b"*/"), 1, first)


    def test_hostile_symbol_names_are_data_in_a_padded_op(self):
        """Symbolic dims named with quotes, a comment's end, a backslash, a
        newline and a '?' (a trigraph), left unbound: the attention fused
        padded names its extents by them in the plugin's tables and its
        messages. They are escaped string data there (no byte of them is
        code), and a line of its own nowhere."""
        import rows_test
        model = rows_test.masked_attention()
        hostile = 'se"q*/\\??=\n#define x'
        for v in list(model.graph.input) + list(model.graph.output):
            for d in v.type.tensor_type.shape.dim:
                if d.dim_param == "seq":
                    d.dim_param = hostile
        src = self.write_model(self.path("att.onnx"), model)
        out, keep = self.path("out.onnx"), self.path("sources")
        r = self.run_cli(src, "-o", out, "--no-cuda", "--budget", "10", "--keep-sources", keep)
        err = r.stderr.decode(errors="replace")
        self.assertEqual(r.returncode, 0, err)
        self.assertIn("serves dims that vary, padded", err)
        text = read(os.path.join(keep, "mo_ops.c"))
        self.assertIn(b'"se\\042q*/\\134\\077\\077=\\077#define x"', text)
        for bad in (b"\n#define x", b'"q*/', b"??="):
            self.assertNotIn(bad, text)
        # progress lines: the newline is a '?', the line whole
        line = next(ln for ln in err.splitlines() if "serves dims that vary" in ln)
        self.assertIn('se"q*/\\??=?#define x up to 64', line)


class SymlinkSafety(Base):
    def plant(self, link):
        """A symlink at `link` to a victim file; returns the victim's path."""
        victim = self.path("victim-" + os.path.basename(link))
        with open(victim, "w") as f:
            f.write("precious\n")
        os.symlink(victim, link)
        return victim

    def assert_untouched(self, victim):
        with open(victim) as f:
            self.assertEqual(f.read(), "precious\n", "written through a symlink")

    def test_a_cache_entry_is_not_written_through_a_planted_symlink(self):
        model = self.write_model(self.path("m.onnx"))
        args = [model, "--search-only", "--budget", "300", "--seed", "3", "-q"]
        self.assertEqual(self.run_cli(*args).returncode, 0)
        cache = self.path("cache")
        (entry,) = os.listdir(cache)
        os.remove(os.path.join(cache, entry))
        victim = self.plant(os.path.join(cache, entry + ".tmp"))
        r = self.run_cli(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assert_untouched(victim)
        self.assertTrue(stat.S_ISREG(os.lstat(os.path.join(cache, entry)).st_mode))
        # a symlink at the entry's own name is replaced, not followed
        os.remove(os.path.join(cache, entry))
        victim2 = self.plant(os.path.join(cache, entry))
        with open(victim2, "w") as f:
            f.write("precious\n")
        self.assertEqual(self.run_cli(*args).returncode, 0)
        self.assert_untouched(victim2)

    def test_dot_is_not_written_through_a_planted_symlink(self):
        model = self.write_model(self.path("m.onnx"))
        dot = self.path("g.dot")
        victims = [self.plant(dot + ".tmp"), self.plant(dot)]
        r = self.run_cli(model, "-q", "--dot", dot)
        self.assertEqual(r.returncode, 0, r.stderr)
        for v in victims:
            self.assert_untouched(v)
        self.assertTrue(stat.S_ISREG(os.lstat(dot).st_mode))
        self.assertIn(b"digraph", read(dot))

    def test_manifest_plugin_and_sources_are_not_written_through_planted_symlinks(self):
        """The manifest's and the plugin's temporaries had names made of
        OUT and the process id; --keep-sources wrote through existing
        names. The symlinks are planted by the child itself, between fork
        and exec, so that they carry the tool's own process id."""
        model = self.write_model(self.path("m.onnx"))
        out = self.path("out.onnx")
        keep = self.path("sources")
        os.mkdir(keep)
        victims = []

        def plant_with_my_pid():
            pid = os.getpid()
            for name in (f"out.mirage.json.tmp{pid}", f"out.mirage.so.tmp{pid}"):
                os.symlink(self.path("victim-tmp"), self.path(name))

        with open(self.path("victim-tmp"), "w") as f:
            f.write("precious\n")
        victims.append(self.path("victim-tmp"))
        for name in ("mo_op0.c", "mo_ops.c", "mo_ort_glue.c", "mo_op0.o", "link.log"):
            victims.append(self.plant(os.path.join(keep, name)))
        r = subprocess.run([CLI, model, "-o", out, *self.fuse_args(), "--keep-sources", keep],
                           capture_output=True, timeout=900, env=self.env,
                           preexec_fn=plant_with_my_pid)
        self.assertEqual(r.returncode, 0, r.stderr)
        for v in victims:
            self.assert_untouched(v)
        manifests = glob.glob(self.path("out.mirage.*.json"))
        self.assertTrue(manifests)
        self.assertTrue(all(stat.S_ISREG(os.lstat(p).st_mode) for p in manifests))
        self.assertTrue(stat.S_ISREG(os.lstat(os.path.join(keep, "mo_op0.c")).st_mode))


class OutputIsAnInput(Base):
    def external_model(self):
        """m.onnx with its weight W in weights.bin."""
        m = rmsnorm_model()
        for t in m.graph.initializer:
            if t.name == "W":
                data = t.raw_data or np.ones((8, 4), np.float32).tobytes()
                with open(self.path("weights.bin"), "wb") as f:
                    f.write(data)
                t.ClearField("raw_data")
                t.ClearField("float_data")
                t.data_location = TensorProto.EXTERNAL
                for k, v in (("location", "weights.bin"), ("offset", "0"),
                             ("length", str(len(data)))):
                    e = t.external_data.add()
                    e.key, e.value = k, v
        return self.write_model(self.path("m.onnx"), m)

    def assert_refused(self, args, needle, inputs):
        before = {p: read(p) for p in inputs}
        listing = sorted(os.listdir(self.dir))
        r = self.run_cli(*args)
        self.assert_one_error_line(r, 1, needle)
        for p, data in before.items():
            self.assertEqual(read(p), data, p + " changed")
        self.assertEqual(sorted(os.listdir(self.dir)), listing, "files appeared or vanished")

    def test_output_naming_the_external_data_file_is_refused(self):
        model = self.external_model()
        weights = self.path("weights.bin")
        self.assert_refused([model, "-o", weights, "--no-fuse", "-q"], "external data",
                            [model, weights])
        # by identity: a hard link and a symlink to the weights as well
        os.link(weights, self.path("hard.onnx"))
        os.symlink(weights, self.path("soft.onnx"))
        for alias in ("hard.onnx", "soft.onnx"):
            self.assert_refused([model, "-o", self.path(alias), "--no-fuse", "-q"],
                                "external data", [model, weights])

    def test_dot_naming_the_input_is_refused(self):
        model = self.external_model()
        weights = self.path("weights.bin")
        for dot in (model, weights, os.path.join(self.dir, ".", "m.onnx")):
            self.assert_refused([model, "--dot", dot, "-q"], "--dot", [model, weights])

    def test_outputs_beside_out_that_are_inputs_are_refused(self):
        """-o m.onnx writes m.mirage.so and m.mirage.json: neither may be the
        model or its external data (checked before any search)."""
        for name in ("m.mirage.json", "m.mirage.so"):
            with self.subTest(name=name):
                model = self.write_model(self.path(name))
                self.assert_refused([model, "-o", self.path("m.onnx"), *self.fuse_args()],
                                    name, [model])
                os.remove(model)
        model = self.external_model()
        os.rename(self.path("weights.bin"), self.path("w.mirage.so"))
        m = read(model).replace(b"weights.bin", b"w.mirage.so")
        with open(model, "wb") as f:
            f.write(m)
        self.assert_refused([model, "-o", self.path("w.onnx"), *self.fuse_args()],
                            "external data", [model, self.path("w.mirage.so")])


def tool_processes(marker):
    """Live processes whose command line mentions marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmd and state != "Z":
            found.append((int(pid), cmd))
    return found


class Cleanup(Base):
    def slow_cc(self):
        """A C compiler that records its process id and that of a child it
        starts (as nvcc starts cicc and ptxas), then waits for a signal."""
        cc = self.path("slowcc.sh")
        with open(cc, "w") as f:
            f.write("#!/bin/sh\n"
                    f"sleep 1000 &\necho $$ $! > {self.path('cc.pids')}.part\n"
                    f"mv {self.path('cc.pids')}.part {self.path('cc.pids')}\n"
                    "wait\n")
        os.chmod(cc, 0o755)
        return cc

    def wait_for(self, path, proc):
        while not os.path.exists(path):
            if proc.poll() is not None:
                self.fail("the tool ended before its compiler started: " +
                          proc.stderr.read().decode(errors="replace"))
            time.sleep(0.05)

    def check_signal_cleans_up(self, sig):
        model = self.write_model(self.path("m.onnx"))
        env = dict(self.env, CC=self.slow_cc())
        before = sorted(os.listdir(self.dir))
        # a background job of a shell starts with SIGINT ignored (and the
        # tool leaves an ignored signal ignored): give it the default
        proc = subprocess.Popen([CLI, model, "-o", self.path("out.onnx"), *self.fuse_args()],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            self.wait_for(self.path("cc.pids"), proc)
            with open(self.path("cc.pids")) as f:
                pids = [int(x) for x in f.read().split()]
            self.assertEqual(len(os.listdir(self.tmp)), 1, "the build folder exists")
            proc.send_signal(sig)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()
        self.assertEqual(proc.returncode, -sig)
        self.assertEqual(os.listdir(self.tmp), [], "temporaries left in TMPDIR")
        after = sorted(x for x in os.listdir(self.dir) if x != "cc.pids")
        self.assertEqual(after, before, "files left beside OUT")
        # the compiler and what it started were sent SIGKILL: they end
        # (gone, or a zombie nobody reaps) without being waited for here
        for pid in pids:
            deadline = time.monotonic() + 60
            while True:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    break
                if state == "Z":
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    self.fail(f"compiler process {pid} still runs")
                time.sleep(0.05)

    def test_sigterm_during_the_build_leaves_nothing_behind(self):
        self.check_signal_cleans_up(signal.SIGTERM)

    def test_sigint_during_the_build_leaves_nothing_behind(self):
        self.check_signal_cleans_up(signal.SIGINT)

    def test_sigterm_during_nvcc_leaves_no_temporaries_or_cuda_tools(self):
        """nvcc runs cicc, ptxas and the host compiler and keeps its own
        temporaries (tmpxft_*) in TMPDIR: the tool gives nvcc its build
        folder as TMPDIR and kills nvcc's whole process group."""
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if not os.access(nvcc, os.X_OK):
            self.skipTest("no nvcc")
        model = self.write_model(self.path("m.onnx"))
        before = sorted(os.listdir(self.dir))
        proc = subprocess.Popen([CLI, model, "-o", self.path("out.onnx"), "-q", "--budget", "300",
                                 "--seed", "3", "--cuda-arch", "80"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=dict(self.env, NVCC=nvcc))
        try:
            # nvcc's first temporary appears in the build folder
            found = False
            while not found:
                if proc.poll() is not None:
                    self.fail("the tool ended before nvcc ran: " +
                              proc.stderr.read().decode(errors="replace"))
                for root, _, files in os.walk(self.tmp):
                    found = found or any(f.startswith("tmpxft") for f in files)
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stderr.close()
        self.assertEqual(proc.returncode, -signal.SIGTERM)
        deadline = time.monotonic() + 60
        while tool_processes(self.tmp):
            if time.monotonic() > deadline:
                self.fail(f"CUDA tools still run: {tool_processes(self.tmp)}")
            time.sleep(0.05)
        self.assertEqual(os.listdir(self.tmp), [], "temporaries left in TMPDIR")
        self.assertEqual(sorted(os.listdir(self.dir)), before, "files left beside OUT")

    def test_a_failed_link_leaves_nothing_behind(self):
        cc = self.path("nolink.sh")
        with open(cc, "w") as f:
            f.write('#!/bin/sh\nfor a in "$@"; do [ "$a" = -shared ] && '
                    '{ echo "ld: cannot find -lnothing" >&2; exit 1; }; done\nexec cc "$@"\n')
        os.chmod(cc, 0o755)
        model = self.write_model(self.path("m.onnx"))
        before = sorted(os.listdir(self.dir))
        r = self.run_cli(model, "-o", self.path("out.onnx"), *self.fuse_args(),
                         env=dict(self.env, CC=cc))
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn(b"linking the plugin failed", r.stderr)
        self.assertEqual(os.listdir(self.tmp), [], "temporaries left in TMPDIR")
        self.assertEqual(sorted(os.listdir(self.dir)), before, "files left beside OUT")


def can_mount_tmpfs():
    d = tempfile.mkdtemp(prefix="mo_mnt_")
    try:
        r = subprocess.run(["unshare", "-Urm", "sh", "-c",
                            f"mount -t tmpfs -o size=64k none {d}"], capture_output=True)
        return r.returncode == 0
    except OSError:
        return False
    finally:
        os.rmdir(d)


class FullDisk(Base):
    """A small tmpfs mounted in a user and mount namespace of our own
    (unshare -Urm): a real full disk, without root."""

    def run_on_tmpfs(self, mount_point, kbytes, args, env):
        os.makedirs(mount_point, exist_ok=True)
        script = ('mount -t tmpfs -o size="$1"k none "$2" || exit 99; shift 2; '
                  '"$@"; rc=$?; ls -A "' + mount_point + '" > "' + self.path("left") +
                  '"; exit $rc')
        r = subprocess.run(["unshare", "-Urm", "sh", "-c", script, "sh", str(kbytes),
                            mount_point, CLI, *args], capture_output=True, timeout=900,
                           env=env)
        self.assertNotEqual(r.returncode, 99, r.stderr)
        with open(self.path("left")) as f:
            left = f.read().split()
        return r, left

    def setUp(self):
        super().setUp()
        if not can_mount_tmpfs():
            self.skipTest("cannot mount a tmpfs in a user namespace here (unshare -Urm)")

    def test_a_full_disk_at_out_is_said_and_exits_1(self):
        """OUT's folder has room for the model but not the plugin: the
        linker used to write there and fail with 'collect2: error: ld
        returned 1 exit status', exit 3."""
        model = self.write_model(self.path("m.onnx"))
        outdir = self.path("full")
        r, left = self.run_on_tmpfs(outdir, 8, [model, "-o", os.path.join(outdir, "out.onnx"),
                                                *self.fuse_args()], self.env)
        self.assert_one_error_line(r, 1, "No space left on device")
        self.assertNotIn(b"collect2", r.stderr)
        self.assertEqual(left, [], "partial files left in OUT's folder")
        self.assertEqual(os.listdir(self.tmp), [])

    def test_a_full_temporary_folder_during_the_build_is_said_and_exits_1(self):
        """TMPDIR has room for the sources and objects but not the linked
        plugin: the cause is named, with exit 1."""
        model = self.write_model(self.path("m.onnx"))
        keep = self.path("sizes")
        r = self.run_cli(model, "-o", self.path("probe.onnx"), *self.fuse_args(),
                         "--keep-sources", keep)
        self.assertEqual(r.returncode, 0, r.stderr)
        pages = lambda n: (n + 4095) // 4096  # noqa: E731
        before_link = sum(pages(os.path.getsize(os.path.join(keep, f)))
                          for f in os.listdir(keep) if f not in ("plugin.so", "link.log"))
        size_kb = 4 * (before_link + 2)
        self.assertLess(size_kb, 4 * (before_link + pages(os.path.getsize(
            os.path.join(keep, "plugin.so")))))
        tmp = self.path("fulltmp")
        env = dict(self.env, TMPDIR=tmp, MIRAGE_ONNX_CACHE=self.path("cache"))
        r, left = self.run_on_tmpfs(tmp, size_kb, [model, "-o", self.path("out.onnx"),
                                                   *self.fuse_args()], env)
        self.assert_one_error_line(r, 1, "no space left on device")
        self.assertNotIn(b"collect2", r.stderr)
        self.assertEqual(left, [], "temporaries left in TMPDIR")
        self.assertFalse(os.path.exists(self.path("out.onnx")))
        self.assertEqual(glob.glob(self.path("out.mirage.*")), [])


class FileSizeLimit(Base):
    def test_the_file_size_limit_is_said_and_exits_1_leaving_nothing(self):
        """ulimit -f below the plugin's size: SIGXFSZ used to end the tool
        (or a compiler) mid-write; a write past the limit now fails with
        EFBIG, named, exit 1, no temporaries."""
        import resource

        def limit():
            resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))

        model = self.write_model(self.path("m.onnx"))
        before = sorted(os.listdir(self.dir))
        r = subprocess.run([CLI, model, "-o", self.path("out.onnx"), *self.fuse_args()],
                           capture_output=True, timeout=900, env=self.env, preexec_fn=limit)
        self.assert_one_error_line(r, 1, "file too large")
        self.assertEqual(os.listdir(self.tmp), [], "temporaries left in TMPDIR")
        self.assertEqual(sorted(os.listdir(self.dir)), before, "files left beside OUT")


if __name__ == "__main__":
    mo_testlib.unittest_main(globals(), verbosity=2)
