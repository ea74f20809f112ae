/* Writes what the float evaluator feeds a model and what it computes, so a
 * test can run the same inputs through ONNX Runtime:
 *     eval_dump MODEL OUTDIR
 * OUTDIR/manifest.json lists {"inputs": [...], "outputs": [...]}, each
 * {"name", "file", "shape"}; files hold little-endian float64 values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_import.h"
#include "mo_verify.h"

#define SEED 7

static void write_f64(const char *dir, int k, const char *kind, const double *v, uint64_t n,
		      char *file, size_t len)
{
	snprintf(file, len, "%s_%d.f64", kind, k);
	char path[1024];
	snprintf(path, sizeof path, "%s/%s", dir, file);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(v, sizeof *v, n, f) != n) {
		fprintf(stderr, "cannot write %s\n", path);
		exit(1);
	}
	fclose(f);
}

static void shape(FILE *m, const struct mo_tensor *t)
{
	fputc('[', m);
	for (int d = 0; d < t->rank; d++)
		fprintf(m, "%s%lld", d ? ", " : "", (long long)t->dims[d]);
	fputc(']', m);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: eval_dump MODEL OUTDIR\n");
		return 2;
	}
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_model *m;
	struct mo_tp *tp;
	struct mo_eval_result r;
	if (mo_onnx_load(argv[1], &m, &d) || mo_tp_import(m, NULL, &tp, &d) ||
	    mo_eval(tp, MO_EVAL_FLOAT, SEED, &r, &d)) {
		fprintf(stderr, "%s\n", d.msg);
		return 1;
	}
	char path[1024], file[64];
	snprintf(path, sizeof path, "%s/manifest.json", argv[2]);
	FILE *man = fopen(path, "w");
	if (!man)
		return 1;
	fputs("{\"inputs\": [", man);
	for (int k = 0; k < tp->n_inputs; k++) {
		const struct mo_tensor *t = &tp->tensors[tp->inputs[k]];
		uint64_t n = mo_tensor_numel(t);
		double *v = malloc((n ? n : 1) * sizeof *v);
		for (uint64_t i = 0; i < n; i++)
			v[i] = mo_eval_input_as(t->name, i, SEED, 1.0, t->dtype);
		write_f64(argv[2], k, "input", v, n, file, sizeof file);
		free(v);
		fprintf(man, "%s{\"name\": ", k ? ", " : "");
		mo_json_string(man, t->name);
		fprintf(man, ", \"file\": \"%s\", \"shape\": ", file);
		shape(man, t);
		fputc('}', man);
	}
	fputs("], \"outputs\": [", man);
	for (int k = 0; k < r.n_outputs; k++) {
		const struct mo_tensor *t = &tp->tensors[tp->outputs[k]];
		write_f64(argv[2], k, "output", r.values[k], r.counts[k], file, sizeof file);
		fprintf(man, "%s{\"name\": ", k ? ", " : "");
		mo_json_string(man, t->name);
		fprintf(man, ", \"file\": \"%s\", \"shape\": ", file);
		shape(man, t);
		fputc('}', man);
	}
	fputs("]}\n", man);
	fclose(man);
	mo_eval_result_free(&r);
	mo_tp_free(tp);
	mo_onnx_free(m);
	return 0;
}
