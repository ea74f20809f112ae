/* Times the full verification of the fused RMSNorm + MatMul μGraph (the
 * paper's Figure 3b) against the ONNX program it replaces:
 *     build/bench/mo_bench_verify MODEL [TRIALS]
 * with MODEL built by models/build.py (rmsnorm_paper_b8_fp32.onnx: X 16×4096,
 * W 4096×6144). scripts/bench_verify.sh builds the model and runs this. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_verify.h"
#include "mugraphs.h"

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s MODEL [TRIALS]\n", argv[0]);
		return 2;
	}
	struct mo_diag d;
	mo_diag_init(&d);
	struct mo_model *m;
	struct mo_tp *tp;
	if (mo_onnx_load(argv[1], &m, &d) || mo_tp_import(m, NULL, &tp, &d)) {
		fprintf(stderr, "%s\n", d.msg);
		return 1;
	}
	const struct mo_tensor *x = NULL, *w = NULL;
	for (int i = 0; i < tp->n_tensors; i++) {
		if (!strcmp(tp->tensors[i].name, "X"))
			x = &tp->tensors[i];
		if (!strcmp(tp->tensors[i].name, "proj.weight"))
			w = &tp->tensors[i];
	}
	if (!x || !w) {
		fprintf(stderr, "%s is not models/build.py's rmsnorm\n", argv[1]);
		return 1;
	}
	/* 64-wide column tiles, 64-deep for-loop chunks, as Mirage's search found */
	int gx = (int)(w->dims[1] / 64), loop = (int)(w->dims[0] / 64);
	struct mo_mugraph *mg = mg_rmsnorm_matmul(tp, RMS_OK, gx, 1, loop);
	char why[256];
	if (!mo_mg_valid(mg, MO_SM90, why, sizeof why)) {
		fprintf(stderr, "invalid μGraph: %s\n", why);
		return 1;
	}
	struct mo_equiv_options opt = MO_EQUIV_DEFAULTS;
	if (argc > 2)
		opt.trials = atoi(argv[2]);
	struct mo_equiv_report rep;
	printf("RMSNorm + MatMul: X %lldx%lld, W %lldx%lld; μGraph: 1 kernel, grid (%d,1,1), "
	       "for-loop %d\n", (long long)x->dims[0], (long long)x->dims[1],
	       (long long)w->dims[0], (long long)w->dims[1], gx, loop);
	double t0 = mo_seconds();
	if (mo_mg_equiv(mg, tp, &opt, &rep, &d)) {
		fprintf(stderr, "%s\n", d.msg);
		return 1;
	}
	double t = mo_seconds() - t0;
	static const char *names[] = { "EQUIVALENT", "NOT EQUIVALENT", "INCONCLUSIVE" };
	printf("full verification: %.2f s (%d finite-field trials of both programs on every "
	       "output element, then the float check)\n", t, rep.trials_run);
	printf("verdict: %s; %s\n", names[rep.verdict], rep.detail);

	/* the fast check the search runs per candidate: the reference once per
	 * seed, then two blocks of each candidate */
	struct mo_ref_memo rc;
	mo_ref_memo_init(&rc, tp);
	struct mo_quick_report q;
	t0 = mo_seconds();
	if (mo_mg_quick_check(mg, &rc, 1, 2, &q, &d)) {
		fprintf(stderr, "%s\n", d.msg);
		return 1;
	}
	double first = mo_seconds() - t0;
	t0 = mo_seconds();
	int n = 10;
	for (int i = 0; i < n && q.verdict == MO_EQUIVALENT; i++)
		if (mo_mg_quick_check(mg, &rc, 1, 2, &q, &d)) {
			fprintf(stderr, "%s\n", d.msg);
			return 1;
		}
	double each = (mo_seconds() - t0) / n;
	printf("fast check: %.2f s the first time (the reference program evaluated once), "
	       "then %.3f s per candidate (%llu of %llu output elements compared): %s\n",
	       first, each, (unsigned long long)q.compared,
	       (unsigned long long)mo_tensor_numel(&mg->kg.tensors[mg->kg.outputs[0]]),
	       names[q.verdict]);
	mo_ref_memo_free(&rc);
	mo_mg_free(mg);
	mo_tp_free(tp);
	mo_onnx_free(m);
	return rep.verdict == MO_EQUIVALENT ? 0 : 1;
}
