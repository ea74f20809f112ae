/* mirage-onnx MODEL --search-only: partition, then search every region, and
 * print the best μGraph of each with its statistics. */
#include "search_cmd.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "mo_search.h"

static void progress_line(void *ctx, const char *line)
{
	(void)ctx;
	fprintf(stderr, "%s\n", line);
}

/* ---- the result cache (DESIGN §9) ---- */

uint64_t cli_fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

/* The region's canonical hash: ops, their parameters and operand positions,
 * tensor shapes and dtypes, input names, constants, and the search limits. */
uint64_t cli_region_key(const struct mo_tp *tp, const struct mo_search_options *o)
{
	uint64_t h = CLI_FNV_OFFSET;
	int *num = calloc((size_t)tp->n_tensors + 1, sizeof *num);
	int next = 1;
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		h = cli_fnv(h, &op->kind, sizeof op->kind);
		struct mo_op_params p = op->p;
		p.sizes = NULL;
		h = cli_fnv(h, &p, sizeof p);
		for (int i = 0; i < op->n_in; i++) {
			int t = op->in[i];
			if (t < 0)
				continue;
			const struct mo_tensor *x = &tp->tensors[t];
			if (num && !num[t]) {
				num[t] = next++;
				if (x->kind != MO_T_VALUE)
					h = cli_fnv(h, x->name, strlen(x->name));
				if (x->fvals)
					h = cli_fnv(h, x->fvals, sizeof *x->fvals * x->n_vals);
			}
			h = cli_fnv(h, num ? &num[t] : &t, sizeof t);
			h = cli_fnv(h, &x->dtype, sizeof x->dtype);
			h = cli_fnv(h, x->dims, sizeof x->dims[0] * (size_t)x->rank);
		}
	}
	for (int j = 0; j < tp->n_outputs; j++) {
		const char *n = tp->tensors[tp->outputs[j]].name;
		h = cli_fnv(h, n, strlen(n));
	}
	h = cli_fnv(h, &o->target, sizeof o->target);
	h = cli_fnv(h, &o->max_block_ops, sizeof o->max_block_ops);
	h = cli_fnv(h, &o->max_kernel_ops, sizeof o->max_kernel_ops);
	if (o->smem_limit) /* a variant for a GPU with less shared memory */
		h = cli_fnv(h, &o->smem_limit, sizeof o->smem_limit);
	free(num);
	return h;
}

bool cli_cache_dir(char *buf, size_t len)
{
	const char *env = getenv("MIRAGE_ONNX_CACHE");
	const char *home = getenv("HOME");
	if (env && *env)
		snprintf(buf, len, "%s", env);
	else if (home && *home)
		snprintf(buf, len, "%s/.cache/mirage-onnx", home);
	else
		return false;
	char parent[1024];
	snprintf(parent, sizeof parent, "%s", buf);
	char *slash = strrchr(parent, '/');
	if (slash && slash != parent) {
		*slash = 0;
		mkdir(parent, 0755);
	}
	return mkdir(buf, 0755) == 0 || errno == EEXIST;
}

/* A cache entry is at most this long: a μGraph has at most MO_MG_MAX_STEPS
 * steps of a few hundred bytes. */
#define CACHE_MAX_BYTES (4u << 20)

/* The μGraph of the entry at path; NULL with why set when it cannot be read
 * or parsed, NULL with why empty when there is no entry. */
static struct mo_mugraph *cache_load(const char *path, char *why, size_t why_len)
{
	why[0] = 0;
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *text = NULL;
	size_t len = 0, cap = 0;
	char chunk[4096];
	size_t n;
	while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
		if (len + n > CACHE_MAX_BYTES) {
			snprintf(why, why_len, "longer than %u bytes", CACHE_MAX_BYTES);
			break;
		}
		if (len + n + 1 > cap) {
			cap = (len + n + 1) * 2;
			char *t = realloc(text, cap);
			if (!t) {
				snprintf(why, why_len, "out of memory reading it");
				break;
			}
			text = t;
		}
		memcpy(text + len, chunk, n);
		len += n;
	}
	if (!why[0] && ferror(f))
		snprintf(why, why_len, "%s", strerror(errno));
	fclose(f);
	if (why[0] || !text) {
		if (!why[0])
			snprintf(why, why_len, "empty");
		free(text);
		return NULL;
	}
	text[len] = 0;
	if (strlen(text) != len) {
		free(text);
		snprintf(why, why_len, "a NUL byte in the text");
		return NULL;
	}
	struct mo_mugraph *mg = NULL;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_mg_from_json(text, &mg, &d))
		snprintf(why, why_len, "%.300s", d.msg);
	free(text);
	return mg;
}

static uint64_t numel(const struct mo_tensor *t)
{
	uint64_t n = 1;
	for (int d = 0; d < t->rank; d++)
		n *= (uint64_t)t->dims[d];
	return n;
}

static bool same_dims(const struct mo_tensor *a, const struct mo_tensor *b)
{
	return a->shape_known && b->shape_known && a->rank == b->rank &&
	       !memcmp(a->dims, b->dims, sizeof *a->dims * (size_t)a->rank);
}

/* Whether a parsed entry's μGraph is one for this region: it reads the
 * region's inputs and weights by name, dtype and shape, makes exactly the
 * region's outputs, and no tensor or tile of it is larger than 16 times the
 * region's largest (a loop split keeps at most 16 partial results): a
 * μGraph with absurd sizes is not evaluated. */
static bool entry_fits(const struct mo_mugraph *mg, const struct mo_tp *prog, char *why,
		       size_t why_len)
{
	uint64_t largest = 1;
	for (int t = 0; t < prog->n_tensors; t++)
		if (prog->tensors[t].shape_known && numel(&prog->tensors[t]) > largest)
			largest = numel(&prog->tensors[t]);
	for (int i = 0; i < mg->kg.n_inputs; i++) {
		const struct mo_tensor *x = &mg->kg.tensors[mg->kg.inputs[i]];
		int r = -1;
		for (int t = 0; t < prog->n_tensors && r < 0; t++)
			if (prog->tensors[t].kind != MO_T_VALUE && !strcmp(prog->tensors[t].name, x->name))
				r = t;
		if (r < 0 || prog->tensors[r].dtype != x->dtype || !same_dims(&prog->tensors[r], x)) {
			snprintf(why, why_len, "its input '%.100s' is not one of the region's, of the "
				 "same dtype and shape", x->name);
			return false;
		}
	}
	if (mg->kg.n_outputs != prog->n_outputs) {
		snprintf(why, why_len, "it has %d outputs, the region %d", mg->kg.n_outputs,
			 prog->n_outputs);
		return false;
	}
	for (int j = 0; j < prog->n_outputs; j++) {
		const struct mo_tensor *y = &prog->tensors[prog->outputs[j]];
		int found = 0;
		for (int i = 0; i < mg->kg.n_outputs; i++) {
			const struct mo_tensor *x = &mg->kg.tensors[mg->kg.outputs[i]];
			if (!strcmp(x->name, y->name) && same_dims(x, y))
				found++;
		}
		if (found != 1) {
			snprintf(why, why_len, "the region's output '%.100s' is not made once, in its "
				 "shape", y->name);
			return false;
		}
	}
	for (int t = 0; t < mg->kg.n_tensors; t++)
		if (mg->kg.tensors[t].shape_known && numel(&mg->kg.tensors[t]) > 16 * largest) {
			snprintf(why, why_len, "a tensor of it is larger than the region's");
			return false;
		}
	for (int b = 0; b < mg->n_blocks; b++)
		for (int t = 0; t < mg->blocks[b]->body.n_tensors; t++)
			if (numel(&mg->blocks[b]->body.tensors[t]) > 16 * largest) {
				snprintf(why, why_len, "a tile of it is larger than the region's");
				return false;
			}
	return true;
}

/* Writes mg's JSON to path through a temporary name; false (errno set) when
 * it could not. */
static bool write_json_file(const char *path, const struct mo_mugraph *mg)
{
	struct mo_file mf;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_file_open(&mf, path, &d))
		return false;
	mo_mg_print_json(mg, mf.f);
	return mo_file_commit(&mf, &d) == MO_OK;
}

void cli_dump_mugraph(const char *dir, const char *label, const struct mo_mugraph *mg)
{
	char path[1100];
	snprintf(path, sizeof path, "%s/region_%s.json", dir, label);
	if (!write_json_file(path, mg))
		fprintf(stderr, "mirage-onnx: warning: could not write %s: %s\n", path,
			strerror(errno));
}

static void cache_path(const struct mo_tp *prog, const struct mo_search_options *o,
		       const char *cache, char *path, size_t len)
{
	snprintf(path, len, "%s/%016" PRIx64 ".json", cache, cli_region_key(prog, o));
}

void cli_cache_drop(const struct mo_tp *prog, const struct mo_search_options *o,
		    const char *cache, const char *why)
{
	char path[1100];
	cache_path(prog, o, cache, path, sizeof path);
	if (remove(path) == 0)
		fprintf(stderr, "mirage-onnx: warning: cache entry %s removed: %s\n", path, why);
}

static enum mo_status find_mugraph(const struct mo_tp *prog, const struct mo_search_options *o,
				   const char *cache, struct mo_search_result *r, bool *cached,
				   struct mo_diag *d);

/* The region's best μGraph: from the cache when an entry is valid for the
 * region and verifies again, else by searching (and then stored in the
 * cache, replacing an entry that was not). The search skips a candidate it
 * cannot allocate as it skips one that fails, so an allocation failure
 * anywhere in it makes the result out of memory: what it found may be
 * poorer, and the run would not give it again. */
enum mo_status cli_find_mugraph(const struct mo_tp *prog, const struct mo_search_options *o,
				const char *cache, struct mo_search_result *r, bool *cached,
				struct mo_diag *d)
{
	unsigned long failures = mo_alloc_failures();
	enum mo_status st = find_mugraph(prog, o, cache, r, cached, d);
	if (mo_alloc_failures() == failures)
		return st;
	mo_search_result_free(r);
	memset(r, 0, sizeof *r);
	*cached = false;
	mo_diag_init(d);
	return mo_diag_nomem(d);
}

static enum mo_status find_mugraph(const struct mo_tp *prog, const struct mo_search_options *o,
				   const char *cache, struct mo_search_result *r, bool *cached,
				   struct mo_diag *d)
{
	memset(r, 0, sizeof *r);
	*cached = false;
	char path[1100];
	const struct mo_gpu *gpu = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	if ((o->time_limit > 0 && mo_seconds() > o->time_limit) ||
	    !mo_search_memory_fits(prog, o, r->why, sizeof r->why))
		cache = NULL; /* past the run's time limit or its memory: mo_search says so */
	if (cache) {
		cache_path(prog, o, cache, path, sizeof path);
		char why[320];
		struct mo_mugraph *mg = cache_load(path, why, sizeof why);
		struct mo_equiv_options eo = MO_EQUIV_DEFAULTS;
		eo.seed = o->seed;
		struct mo_diag quiet;
		mo_diag_init(&quiet);
		if (mg && entry_fits(mg, prog, why, sizeof why) &&
		    mo_search_mg_valid(mg, o, why, sizeof why)) {
			if (mo_mg_equiv(mg, prog, &eo, &r->verification, &quiet))
				snprintf(why, sizeof why, "it cannot be verified: %.200s", quiet.msg);
			else if (r->verification.verdict != MO_EQUIVALENT)
				snprintf(why, sizeof why, "it is not equivalent to the region");
			else {
				r->best = mg; /* re-verified: the cache is never trusted */
				*cached = true;
				mo_cost_mugraph(mg, gpu, &r->cost_best);
				mo_cost_program(prog, gpu, &r->cost_unfused);
				return MO_OK;
			}
			memset(&r->verification, 0, sizeof r->verification);
		}
		mo_mg_free(mg);
		if (why[0]) {
			for (char *c = why; *c; c++) /* one line */
				if (*c == '\n' || *c == '\r')
					*c = ' ';
			fprintf(stderr, "mirage-onnx: warning: cache entry %s ignored (%s); searching "
				"again\n", path, why);
		}
	}
	unsigned long failures = mo_alloc_failures();
	enum mo_status st = mo_search(prog, o, r, d);
	if (!st && r->stats.safety_net)
		fprintf(stderr, "mirage-onnx: warning: the search of the region at '%s' (%d ops) "
			"was stopped by its CPU-time safety net, far past its budget: what it found "
			"depends on timing and is not cached\n",
			prog->n_ops > 0 && prog->node_names && prog->ops[0].node >= 0
				? prog->node_names[prog->ops[0].node] : "?", prog->n_ops);
	if (!st && r->best && cache && !r->stats.safety_net && mo_alloc_failures() == failures)
		(void)write_json_file(path, r->best); /* a cache entry is optional */
	else if (!st && cache)
		remove(path); /* an invalid entry is not read again */
	return st;
}

/* ---- printing ---- */

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

int cli_search(const struct mo_model *m, const struct cli_search_args *a, struct mo_diag *d)
{
	struct mo_tp *tp;
	if (mo_tp_import(m, a->import, &tp, d))
		return d->status == MO_ERR_USAGE ? 2 : 1;
	struct mo_partition *p;
	if (mo_part_run(tp, a->part, &p, d)) {
		mo_tp_free(tp);
		return 1;
	}
	char dir[1024];
	bool use_cache = !a->no_cache && cli_cache_dir(dir, sizeof dir);
	FILE *out = stdout;
	if (a->json)
		fputs("{\"regions\": [", out);
	int rc = 0;
	for (int ri = 0; ri < p->n_regions && !rc; ri++) {
		const struct mo_region *rg = &p->regions[ri];
		struct mo_tp *prog;
		if (mo_tp_region(tp, rg->ops, rg->n_ops, rg->inputs, rg->n_inputs, rg->outputs,
				 rg->n_outputs, &prog, d)) {
			rc = 3;
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
		if (cli_find_mugraph(prog, &o, use_cache ? dir : NULL, &r, &cached, &sd)) {
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
			cli_dump_mugraph(a->dump_dir, lb, r.best);
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
	return rc;
}
