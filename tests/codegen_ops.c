/* Every op the code generator emits, against the float evaluator, on ONNX's
 * own operator tests (ggml's test-backend-ops, for our CPU backend).
 *
 *   codegen_ops SUITE_DIR
 *
 * For each SUITE_DIR/<case>/model.onnx whose program is one op over float
 * (or bool) tensors of static shape, it builds the μGraph with that op as its single
 * pre-defined kernel, generates and compiles its CPU kernel, and runs the
 * plugin's float check against the program (the evaluator is itself checked
 * against ONNX Runtime by float_evaluator_vs_onnxruntime). Ops the generator
 * does not emit are counted, not failed. Prints one line per failure and a
 * summary; exits 1 on any failure or when fewer than MIN_CHECKED ops were
 * checked (the test must not pass by checking nothing). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mo_plugin.h"
#include "mugraphs.h"

#define MIN_CHECKED 100

/* float, and bool (comparisons, Not, And, Or, Where's condition) */
static bool float_type(int32_t dt)
{
	return dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
}

/* The one-op μGraph of a one-op program, or NULL when it is not one. */
static struct mo_mugraph *one_op_mugraph(const struct mo_tp *tp)
{
	if (tp->n_ops != 1 || tp->n_outputs != 1)
		return NULL;
	const struct mo_tp_op *op = &tp->ops[0];
	if (op->n_out != 1 || op->lax == MO_LAX_NONE)
		return NULL;
	const struct mo_tensor *y = &tp->tensors[op->out[0]];
	if (!y->shape_known || !float_type(y->dtype) || op->out[0] != tp->outputs[0])
		return NULL;
	struct mo_mugraph *mg = mo_mg_new();
	int in[8];
	if (op->n_in > 8) {
		mo_mg_free(mg);
		return NULL;
	}
	for (int i = 0; i < op->n_in; i++) {
		const struct mo_tensor *t = op->in[i] >= 0 ? &tp->tensors[op->in[i]] : NULL;
		if (!t || !t->shape_known || !float_type(t->dtype)) {
			mo_mg_free(mg);
			return NULL;
		}
		in[i] = mg_program_input(mg, tp, t->name);
	}
	int out = mo_mg_kernel(mg, op->kind, op->n_in, in, &op->p);
	mo_mg_output(mg, out, y->name);
	if (mg->error[0]) {
		mo_mg_free(mg);
		return NULL;
	}
	return mg;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: codegen_ops SUITE_DIR\n");
		return 2;
	}
	DIR *dp = opendir(argv[1]);
	if (!dp) {
		perror(argv[1]);
		return 2;
	}
	char tmp[] = "/tmp/mo_codegen_ops_XXXXXX";
	if (!mkdtemp(tmp))
		return 2;
	struct dirent *e;
	int checked = 0, failed = 0, unsupported = 0, skipped = 0;
	int per_op[MO_OP__COUNT] = { 0 };
	while ((e = readdir(dp))) {
		if (strncmp(e->d_name, "test_", 5))
			continue;
		char path[4096];
		snprintf(path, sizeof path, "%s/%s/model.onnx", argv[1], e->d_name);
		struct mo_diag d;
		mo_diag_init(&d);
		struct mo_model *m = NULL;
		struct mo_tp *tp = NULL;
		if (access(path, R_OK) || mo_onnx_load(path, &m, &d) || mo_tp_import(m, NULL, &tp, &d)) {
			mo_onnx_free(m);
			continue;
		}
		struct mo_mugraph *mg = one_op_mugraph(tp);
		if (!mg) {
			skipped++;
			goto next;
		}
		struct mo_cg_op op = { .name = "MirageOpTest", .mg = mg };
		/* emit first: what the generator refuses is not a failure */
		char why[300] = "";
		struct mo_cg_options co = { .banner = "codegen_ops", .target = MO_SM90 };
		FILE *devnull = fopen("/dev/null", "w");
		enum mo_status st = mo_cg_emit(&op, "t", false, &co, devnull, why, sizeof why, &d);
		fclose(devnull);
		if (st == MO_ERR_UNSUPPORTED) {
			unsupported++;
			goto next_mg;
		}
		char so[4200];
		snprintf(so, sizeof so, "%s/op.so", tmp);
		struct mo_plugin_options o = { .cuda = false, .cg = co };
		struct mo_plugin_op_report rep;
		struct mo_plugin_lib *lib = NULL;
		struct mo_plugin_check c = { 0 };
		if (mo_plugin_build(&op, 1, &o, so, &rep, &d) || mo_plugin_open(so, &lib, &d) ||
		    mo_plugin_check_cpu(lib, &op, tp, 5, &c, &d)) {
			/* the evaluator cannot run some inputs (NaN weights...) */
			if (d.status == MO_ERR_UNSUPPORTED || d.status == MO_ERR_INPUT) {
				skipped++;
			} else {
				failed++;
				printf("FAIL %s (%s): %s %s\n", e->d_name, mo_op_table[tp->ops[0].kind].name,
				       d.msg, rep.why);
			}
		} else if (!c.ok) {
			failed++;
			printf("FAIL %s (%s): %s\n", e->d_name, mo_op_table[tp->ops[0].kind].name, c.detail);
		} else {
			checked++;
			per_op[tp->ops[0].kind]++;
		}
		mo_plugin_close(lib);
		unlink(so);
next_mg:
		mo_mg_free(mg);
next:
		mo_tp_free(tp);
		mo_onnx_free(m);
	}
	closedir(dp);
	rmdir(tmp);
	printf("ops checked:");
	for (int k = 0; k < MO_OP__COUNT; k++)
		if (per_op[k])
			printf(" %s %d", mo_op_table[k].name, per_op[k]);
	printf("\n%d checked, %d failed, %d not emitted by the generator, %d not one float op\n",
	       checked, failed, unsupported, skipped);
	if (checked < MIN_CHECKED) {
		printf("FAIL: fewer than %d checked\n", MIN_CHECKED);
		return 1;
	}
	return failed ? 1 : 0;
}
