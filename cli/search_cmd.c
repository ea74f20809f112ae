/* mirage-onnx MODEL --search-only: partition, then search every region, and
 * print the best μGraph of each with its statistics. */
#include "search_cmd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mo_fuse.h"
#include "mo_search.h"

static void progress_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "%s\n", line);
}

static void describe_kernels(const struct mo_mugraph *mg, enum mo_target target, FILE *out)
{
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) {
			fprintf(out, "    kernel %d: %s (pre-defined)\n", k + 1,
				mo_op_table[op->op.kind].name);
			continue;
		}
		const struct mo_block_graph *bg = op->bg;
		struct mo_bg_plan plan; /* as the code generator lays it out */
		bool dbuf = mo_bg_plan_pipelined(bg, mo_target_smem(target), &plan);
		fprintf(out, "    kernel %d: graph-defined, grid (%d,%d,%d), for-loop %d, %d block ops, "
			"%d thread graph%s, %.1f KB shared memory (%.1f KB unshared%s)\n      ", k + 1,
			bg->grid[0], bg->grid[1], bg->grid[2], bg->forloop, bg->body.n_ops + bg->n_accums,
			bg->n_tgs, bg->n_tgs == 1 ? "" : "s", plan.bytes / 1024.0,
			plan.bytes_unshared / 1024.0, dbuf ? "; input tiles double-buffered" : "");
		for (int i = 0; i < bg->body.n_ops; i++)
			fprintf(out, "%s%s", i ? " " : "", mo_op_table[bg->body.ops[i].kind].name);
		for (int a = 0; a < bg->n_accums; a++)
			fprintf(out, " Accum(%s)", bg->accums[a].kind == MO_ACC_SUM ? "sum"
						   : bg->accums[a].kind == MO_ACC_MAX ? "max" : "rescaled");
		fputc('\n', out);
	}
}

static int count_gdk(const struct mo_mugraph *mg)
{
	int n = 0;
	for (int k = 0; k < mg->n_ops; k++)
		n += mg->ops[k].bg != NULL;
	return n;
}

enum mo_status cli_search(const struct mo_model *m, const struct cli_search_args *a,
			  struct mo_diag *d)
{
	struct mo_tp *tp;
	char said[MO_FUSE_SAID_LEN];
	/* as the fuse sees it: unbound dims left symbolic, searched at a size */
	if (mo_fuse_import(m, a->import, &tp, NULL, said, sizeof said, d))
		return d->status;
	if (said[0])
		fprintf(stderr, "mirage-onnx: note: %s\n", said);
	struct mo_partition *p;
	if (mo_part_run(tp, a->part, &p, d)) {
		mo_tp_free(tp);
		return d->status;
	}
	char dir[1024];
	char why[160];
	bool use_cache = !a->no_cache && mo_search_cache_dir(dir, sizeof dir, why, sizeof why);
	if (!a->no_cache && !use_cache && why[0])
		fprintf(stderr, "mirage-onnx: warning: " MO_SEARCH_CACHE_UNUSABLE "\n", dir, why);
	FILE *out = stdout;
	if (a->json)
		fputs("{\"regions\": [", out);
	enum mo_status st = MO_OK;
	for (int ri = 0; ri < p->n_regions && !st; ri++) {
		const struct mo_region *rg = &p->regions[ri];
		struct mo_tp *prog;
		if (mo_tp_region(tp, rg->ops, rg->n_ops, rg->inputs, rg->n_inputs, rg->outputs,
				 rg->n_outputs, &prog, d)) {
			st = d->status;
			break;
		}
		struct mo_search_options o = *a->search;
		if (!a->quiet && !a->json) {
			o.progress = progress_line;
			fprintf(stderr, "region %d/%d: %d ops, searching (budget %.0f s)\n", ri + 1,
				p->n_regions, rg->n_ops, o.budget_s);
		}
		struct mo_search_result r;
		bool cached = false;
		struct mo_diag sd;
		mo_diag_init(&sd);
		if (mo_search_cached(prog, &o, use_cache ? dir : NULL, &r, &cached, &sd)) {
			/* as when fusing: the region stays unfused, the others go on */
			mo_search_result_free(&r);
			memset(&r, 0, sizeof r);
			if (sd.status == MO_ERR_NOMEM)
				snprintf(r.why, sizeof r.why, "out of memory");
			else
				snprintf(r.why, sizeof r.why, "search failed: %.200s", sd.msg);
		}
		if (r.best && a->dump_dir) {
			char lb[16];
			snprintf(lb, sizeof lb, "%d", ri + 1);
			struct mo_diag dd;
			mo_diag_init(&dd);
			if (mo_fuse_dump_mugraph(a->dump_dir, lb, r.best, &dd))
				fprintf(stderr, "mirage-onnx: warning: %s\n", dd.msg);
		}
		double speedup = r.best && r.cost_best.us > 0 ? r.cost_unfused.us / r.cost_best.us : 1;
		if (a->json) {
			fprintf(out, "%s\n  {\"nodes\": [", ri ? "," : "");
			for (int i = 0; i < rg->n_nodes; i++) {
				fputs(i ? ", " : "", out);
				mo_json_string(out, tp->node_names[rg->nodes[i]]);
			}
			fprintf(out, "], \"fused\": %s, \"kernels\": %d, \"graph_defined_kernels\": %d, "
				"\"cached\": %s, \"search_seconds\": %.3f, \"states\": %" PRIu64
				", \"pruned_absexpr\": %" PRIu64 ", \"pruned_shape\": %" PRIu64
				", \"pruned_duplicate\": %" PRIu64 ", \"pruned_dead_end\": %" PRIu64
				", \"pruned_memory\": %" PRIu64 ", \"candidates\": %" PRIu64
				", \"quick_rejected\": %" PRIu64 ", \"verified\": %" PRIu64
				", \"schedules\": %d, \"kernel_pieces\": %d, \"kernel_graphs\": %" PRIu64
				", \"rewrites\": %" PRIu64 ", \"budget_hit\": %s"
				", \"safety_net\": %s, \"time_limit\": %s"
				", \"proofs\": %d, \"proof_seconds\": %.3f"
				", \"solver_calls\": %" PRIu64
				", \"cost_us\": %.3f, \"unfused_cost_us\": %.3f, \"estimated_speedup\": %.3f",
				r.best ? "true" : "false", r.best ? r.best->n_ops : 0,
				r.best ? count_gdk(r.best) : 0, cached ? "true" : "false", r.stats.seconds,
				r.stats.states, r.stats.pruned_absexpr, r.stats.pruned_shape,
				r.stats.pruned_duplicate, r.stats.pruned_dead_end, r.stats.pruned_memory,
				r.stats.candidates, r.stats.quick_rejected, r.stats.verified,
				r.stats.schedules, r.stats.kernel_pieces, r.stats.kernel_graphs,
				r.stats.rewrites, r.stats.budget_hit ? "true" : "false",
				r.stats.safety_net ? "true" : "false", r.stats.time_limit ? "true" : "false",
				r.stats.proofs,
				r.stats.proof_seconds, r.stats.subexpr.solver_calls,
				r.best ? r.cost_best.us : r.cost_unfused.us,
				r.cost_unfused.us, speedup);
			if (r.best) {
				const struct mo_block_graph *bg = NULL;
				for (int k = 0; k < r.best->n_ops && !bg; k++)
					bg = r.best->ops[k].bg;
				if (bg)
					fprintf(out, ", \"grid\": [%d, %d, %d], \"forloop\": %d", bg->grid[0],
						bg->grid[1], bg->grid[2], bg->forloop);
				fprintf(out, ", \"error_bound\": %.3g", r.verification.error_bound);
				if (r.rewrite[0]) {
					fputs(", \"rewrite\": ", out);
					mo_json_string(out, r.rewrite);
				}
			} else {
				fputs(", \"why\": ", out);
				mo_json_string(out, r.why);
				fputs(", \"parts\": [", out);
				for (int k = 0; k < r.n_parts; k++) {
					fputs(k ? ", [" : "[", out);
					for (int i = 0, first = 1; i < rg->n_ops; i++)
						if (r.part_of[i] == k) {
							fputs(first ? "" : ", ", out);
							mo_json_string(out, tp->node_names[prog->ops[i].node]);
							first = 0;
						}
					fputc(']', out);
				}
				fputc(']', out);
			}
			fputc('}', out);
		} else {
			printf("region %d: %d ops (%s", ri + 1, rg->n_ops,
			       tp->node_names[rg->nodes[0]]);
			if (rg->n_nodes > 1)
				printf(" .. %s", tp->node_names[rg->nodes[rg->n_nodes - 1]]);
			printf(")\n");
			if (r.best) {
				printf("  best μGraph%s: %d kernel%s, estimated %.1f µs vs %.1f µs unfused "
				       "(%d kernels): %.2fx\n", cached ? " (from the cache, re-verified)" : "",
				       r.best->n_ops, r.best->n_ops == 1 ? "" : "s", r.cost_best.us,
				       r.cost_unfused.us, r.cost_unfused.kernels, speedup);
				if (r.rewrite[0])
					printf("  from another program for the region: %s\n", r.rewrite);
				describe_kernels(r.best, o.target, stdout);
				printf("  verified: %s\n", r.verification.detail);
			} else {
				printf("  stays unfused: %s\n", r.why);
				for (int k = 0; k < r.n_parts; k++) {
					printf("  part %d, fuses on its own:", k + 1);
					for (int i = 0; i < rg->n_ops; i++)
						if (r.part_of[i] == k)
							printf(" %s", tp->node_names[prog->ops[i].node]);
					printf("\n");
				}
			}
			if (!cached)
				printf("  search: %.2f s, %d schedule classes, %" PRIu64 " states, pruned %"
				       PRIu64 " by abstract expression, %" PRIu64 " by shape, %" PRIu64
				       " duplicates, %" PRIu64 " dead ends, %" PRIu64 " by memory; %" PRIu64
				       " candidates, %" PRIu64 " refuted by the fast check, %" PRIu64
				       " verified; %d runs of ops searched as kernels of several; %" PRIu64
				       " kernel graphs, %" PRIu64 " other ways to compute a tensor%s; "
				       "%d full verification%s, %.2f s\n",
				       r.stats.seconds, r.stats.schedules, r.stats.states,
				       r.stats.pruned_absexpr, r.stats.pruned_shape,
				       r.stats.pruned_duplicate, r.stats.pruned_dead_end,
				       r.stats.pruned_memory, r.stats.candidates, r.stats.quick_rejected,
				       r.stats.verified, r.stats.kernel_pieces, r.stats.kernel_graphs,
				       r.stats.rewrites, r.stats.safety_net
						? " (stopped by the CPU-time safety net: depends on timing)"
						: r.stats.budget_hit ? " (budget hit)" : "",
				       r.stats.proofs,
				       r.stats.proofs == 1 ? "" : "s", r.stats.proof_seconds);
		}
		mo_search_result_free(&r);
		mo_tp_free(prog);
	}
	if (a->json)
		fputs("\n]}\n", out);
	mo_part_free(p);
	mo_tp_free(tp);
	return st;
}
