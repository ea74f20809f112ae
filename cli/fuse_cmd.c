/* mirage-onnx MODEL -o OUT: runs the fuse pipeline (fuse/) and prints what
 * it did. */
#include "fuse_cmd.h"

#include <stdio.h>
#include <string.h>

static void progress_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "%s\n", line);
}

void cli_warning_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "mirage-onnx: warning: %s\n", line);
}

/* The region table: each region's outcome, then why those not fused are
 * not. */
static void print_summary(const struct mo_fuse_report *rep, FILE *out)
{
	const struct mo_tp *tp = rep->tp;
	int nu = rep->n_regions;
	const struct mo_fuse_region *rs = rep->regions;
	fprintf(out, "\n%-6s %-4s %-34s %-8s %-8s %-9s %-22s %s\n", "region", "ops", "nodes", "status",
		"kernels", "est. gain", "verified", "kernel check");
	for (int ri = 0; ri < nu; ri++) {
		const struct mo_region *rg = rs[ri].rg;
		const struct mo_fuse_region *s = &rs[ri];
		char lb[32];
		char nodes[128], gain[16] = "-", ver[40] = "-", chk[24] = "-", kern[8] = "-";
		snprintf(nodes, sizeof nodes, "%s%s%s", tp->node_names[rg->nodes[0]],
			 rg->n_nodes > 1 ? " .. " : "",
			 rg->n_nodes > 1 ? tp->node_names[rg->nodes[rg->n_nodes - 1]] : "");
		if (strlen(nodes) > 34)
			strcpy(nodes + 31, "...");
		if (s->r.best) {
			snprintf(kern, sizeof kern, "%d", s->r.best->n_ops);
			if (s->r.cost_best.us > 0)
				snprintf(gain, sizeof gain, "%.2fx", s->r.cost_unfused.us / s->r.cost_best.us);
			snprintf(ver, sizeof ver, "%d trials, p<%.0e", s->r.verification.trials_run,
				 s->r.verification.error_bound);
		}
		if (s->fused)
			snprintf(chk, sizeof chk, "err %.1e", s->check.max_rel);
		fprintf(out, "%-6s %-4d %-34s %-8s %-8s %-9s %-22s %s\n", mo_fuse_label(rep, ri, lb, sizeof lb),
			rg->n_ops, nodes, s->fused ? "fused" : s->split ? "split" : "unfused", kern, gain,
			ver, chk);
	}
	for (int ri = 0; ri < nu; ri++)
		if (!rs[ri].fused) {
			char lb[32];
			fprintf(out, "  region %s %s: %s\n", mo_fuse_label(rep, ri, lb, sizeof lb),
				rs[ri].split ? "is fused in parts where it can be, because" : "stays unfused",
				rs[ri].why);
		}
}

enum mo_status cli_fuse(struct mo_model *m, struct mo_fuse_options *o, bool quiet,
			struct mo_diag *d)
{
	o->progress = quiet ? NULL : progress_line;
	o->warning = cli_warning_line;
	fflush(stdout);
	struct mo_fuse_report rep;
	enum mo_status st = mo_fuse_run(m, o, &rep, d);
	if (rep.decided && !quiet)
		print_summary(&rep, stdout);
	if (rep.written && !quiet) {
		printf("\n%-10s %s (%d of %d region%s fused, parts included)\n", "wrote",
		       o->out_path, rep.n_fused, rep.n_regions, rep.n_regions == 1 ? "" : "s");
		if (rep.plugin[0]) {
			printf("%-10s %s (custom-op domain %s)\n", "plugin", rep.plugin, rep.domain);
			printf("%-10s %s\n", "manifest", rep.manifest);
		}
	}
	mo_fuse_report_free(&rep);
	return st;
}
