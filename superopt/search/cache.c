/* The search's result cache (DESIGN §9): a region's best μGraph kept as
 * JSON under the region's key, validated against the region and verified
 * again every time it is read, never trusted. */
#include "search_int.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The region's canonical hash: ops, their parameters and operand positions,
 * tensor shapes and dtypes, input names, constants, and the search limits. */
uint64_t mo_search_region_key(const struct mo_tp *tp, const struct mo_search_options *o)
{
	uint64_t h = MO_FNV_OFFSET;
	int *num = calloc((size_t)tp->n_tensors + 1, sizeof *num);
	int next = 1;
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		h = mo_fnv(h, &op->kind, sizeof op->kind);
		struct mo_op_params p = op->p;
		p.sizes = NULL;
		h = mo_fnv(h, &p, sizeof p);
		for (int i = 0; i < op->n_in; i++) {
			int t = op->in[i];
			if (t < 0)
				continue;
			const struct mo_tensor *x = &tp->tensors[t];
			if (num && !num[t]) {
				num[t] = next++;
				if (x->kind != MO_T_VALUE)
					h = mo_fnv(h, x->name, strlen(x->name));
				if (x->fvals)
					h = mo_fnv(h, x->fvals, sizeof *x->fvals * x->n_vals);
			}
			h = mo_fnv(h, num ? &num[t] : &t, sizeof t);
			h = mo_fnv(h, &x->dtype, sizeof x->dtype);
			h = mo_fnv(h, x->dims, sizeof x->dims[0] * (size_t)x->rank);
		}
	}
	for (int j = 0; j < tp->n_outputs; j++) {
		const char *n = tp->tensors[tp->outputs[j]].name;
		h = mo_fnv(h, n, strlen(n));
	}
	h = mo_fnv(h, &o->target, sizeof o->target);
	h = mo_fnv(h, &o->max_block_ops, sizeof o->max_block_ops);
	h = mo_fnv(h, &o->max_kernel_ops, sizeof o->max_kernel_ops);
	if (o->smem_limit) /* a variant for a GPU with less shared memory */
		h = mo_fnv(h, &o->smem_limit, sizeof o->smem_limit);
	free(num);
	return h;
}

bool mo_search_cache_dir(char *buf, size_t len)
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

static void cache_path(const struct mo_tp *prog, const struct mo_search_options *o,
		       const char *cache, char *path, size_t len)
{
	snprintf(path, len, "%s/%016" PRIx64 ".json", cache, mo_search_region_key(prog, o));
}

void mo_search_cache_drop(const struct mo_tp *prog, const struct mo_search_options *o,
		    const char *cache, const char *why)
{
	char path[1100];
	cache_path(prog, o, cache, path, sizeof path);
	if (remove(path) == 0)
		mo_progressf(o->warning, o->warning_ctx, "cache entry %s removed: %s", path, why);
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
enum mo_status mo_search_cached(const struct mo_tp *prog, const struct mo_search_options *o,
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
			mo_progressf(o->warning, o->warning_ctx, "cache entry %s ignored (%s); "
				     "searching again", path, why);
		}
	}
	unsigned long failures = mo_alloc_failures();
	enum mo_status st = mo_search(prog, o, r, d);
	if (!st && r->stats.safety_net)
		mo_progressf(o->warning, o->warning_ctx, "the search of the region at '%s' (%d ops) "
			     "was stopped by its CPU-time safety net, far past its budget: what it "
			     "found depends on timing and is not cached",
			prog->n_ops > 0 && prog->node_names && prog->ops[0].node >= 0
				? prog->node_names[prog->ops[0].node] : "?", prog->n_ops);
	struct mo_diag ignored; /* a cache entry is optional */
	mo_diag_init(&ignored);
	if (!st && r->best && cache && !r->stats.safety_net && mo_alloc_failures() == failures)
		(void)mo_mg_write_json(r->best, path, &ignored);
	else if (!st && cache)
		remove(path); /* an invalid entry is not read again */
	return st;
}
