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
#include <unistd.h>

/* Numbers the tensors prog's ops read and make, 1.., in the order the ops
 * first name them (each op's operands, then its results): the same numbers
 * for two regions that differ in tensor names alone, such as one layer of a
 * model and the next. num has prog->n_tensors entries, 0 for a tensor no op
 * names. Returns how many are numbered. */
static int canon_numbers(const struct mo_tp *prog, int *num)
{
	int next = 0;
	memset(num, 0, sizeof *num * (size_t)prog->n_tensors);
	for (int k = 0; k < prog->n_ops; k++) {
		const struct mo_tp_op *op = &prog->ops[k];
		for (int i = 0; i < op->n_in + op->n_out; i++) {
			int t = i < op->n_in ? op->in[i] : op->out[i - op->n_in];
			if (t >= 0 && !num[t])
				num[t] = ++next;
		}
	}
	return next;
}

/* Values in a key: a scalar constant's or weight's are part of a region's
 * key (a norm's epsilon, a scale: what a μGraph may hold as a constant of
 * its own); a larger one's are not (a μGraph reads it as an input, bound to
 * whichever the region has, and is verified with it). A fused op's key also
 * holds the values of the constants its function body holds, up to
 * OP_KEY_MAX_VALUES elements, else their names. */
#define OP_KEY_MAX_VALUES 4096

/* Adds x's values to *h when it has at most max elements (and they can be
 * read); false when it does not. */
static bool hash_values(uint64_t *h, const struct mo_tp *prog, const struct mo_tensor *x,
			uint64_t max)
{
	uint64_t n = mo_tensor_numel(x);
	if (!x->shape_known || n > max)
		return false;
	if (x->fvals) {
		*h = mo_fnv(*h, x->fvals, sizeof *x->fvals * x->n_vals);
		return true;
	}
	if (x->ivals) {
		*h = mo_fnv(*h, x->ivals, sizeof *x->ivals * x->n_vals);
		return true;
	}
	double *v = x->init ? mo_malloc(sizeof *v * (size_t)(n + 1)) : NULL;
	bool read = v && mo_onnx_tensor_doubles(prog->model, x->init, n, 0, n, v);
	if (read)
		*h = mo_fnv(mo_fnv(*h, "v", 1), v, sizeof *v * n);
	mo_free(v);
	return read;
}

/* The search's generation: raised whenever the search can find what an
 * earlier one could not (new block ops, a wider enumeration), so that an
 * entry an older search wrote, above all its "found nothing", is not taken
 * for this one's. 2: comparisons, logic and Where as block ops. 3:
 * ReduceMax and Log as block ops, an output saved through a Reshape of
 * dims of 1, MatMuls reading B transposed. 4: an infinity is one unknown
 * of the field wherever it is (a guard's own -inf now checks). 5: axes a
 * Reshape merges walked one outer step at a time; a cover's kernels that
 * hand each other tiles merged into one. 6: a Split's parts (Slices of what
 * a kernel saved) saved by that kernel; an output axis a Reshape merged on
 * the grid through its outer axis. 7: Slices, Neg and Concat over a tile's
 * last axis (rotary embeddings). 8: Cos, Sin and Abs as block ops, a part
 * concatenated to itself, And/Or with a constant, Where over two
 * constants, an Expand's dims tied to its operand's (GQA's repeat_kv). 10:
 * a Cast rounding to fp16 or bf16 as a block op (fp16 exports' norms). 11:
 * a cover's greedy growth looks past views (softmax through repeat_kv to
 * the MatMul with V). */
#define SEARCH_GENERATION 11u

/* The region's canonical hash: ops, their parameters and operand positions,
 * the kinds, dtypes and shapes of the tensors they read and make, small
 * constants' values, which tensors are outputs, the search limits and its
 * generation. No name: identical layers of a model share a key (and so a
 * cache entry). */
uint64_t mo_search_region_key(const struct mo_tp *tp, const struct mo_search_options *o)
{
	const unsigned generation = SEARCH_GENERATION;
	uint64_t h = mo_fnv(MO_FNV_OFFSET, &generation, sizeof generation);
	int *num = mo_calloc((size_t)tp->n_tensors + 1, sizeof *num);
	if (!num) /* a key of its own: never a wrong hit */
		return mo_fnv(h, &tp, sizeof tp);
	canon_numbers(tp, num);
	int described = 0; /* the walk meets tensors in their numbers' order */
	for (int k = 0; k < tp->n_ops; k++) {
		const struct mo_tp_op *op = &tp->ops[k];
		h = mo_fnv(h, &op->kind, sizeof op->kind);
		struct mo_op_params p = op->p;
		p.sizes = NULL;
		h = mo_fnv(h, &p, sizeof p);
		if (op->p.sizes && op->p.n_sizes > 0)
			h = mo_fnv(h, op->p.sizes, sizeof *op->p.sizes * (size_t)op->p.n_sizes);
		h = mo_fnv(h, &op->n_in, sizeof op->n_in);
		for (int i = 0; i < op->n_in + op->n_out; i++) {
			int t = i < op->n_in ? op->in[i] : op->out[i - op->n_in];
			h = mo_fnv(h, t >= 0 ? &num[t] : &t, sizeof t);
			if (t < 0)
				continue;
			const struct mo_tensor *x = &tp->tensors[t];
			if (num[t] > described) { /* first met */
				described = num[t];
				h = mo_fnv(h, &x->kind, sizeof x->kind);
				if (x->kind != MO_T_VALUE && x->kind != MO_T_INPUT)
					(void)hash_values(&h, tp, x, 1);
			}
			h = mo_fnv(h, &x->dtype, sizeof x->dtype);
			h = mo_fnv(h, &x->rank, sizeof x->rank);
			h = mo_fnv(h, x->dims, sizeof x->dims[0] * (size_t)x->rank);
		}
	}
	for (int j = 0; j < tp->n_outputs; j++)
		h = mo_fnv(h, &num[tp->outputs[j]], sizeof num[0]);
	h = mo_fnv(h, &o->target, sizeof o->target);
	h = mo_fnv(h, &o->max_block_ops, sizeof o->max_block_ops);
	h = mo_fnv(h, &o->max_kernel_ops, sizeof o->max_kernel_ops);
	if (o->smem_limit) /* a variant for a GPU with less shared memory */
		h = mo_fnv(h, &o->smem_limit, sizeof o->smem_limit);
	if (o->any_speed)
		h = mo_fnv(h, "any speed", 9);
	mo_free(num);
	return h;
}

/* ---- canonical names: a μGraph found for one region, for another ---- */

/* The names of one region's numbered tensors (index: canon_numbers' number),
 * or "c<number>", the names a cache entry is written with. */
struct names {
	const struct mo_tp *prog;
	int *num;
	int n;
	const char **name;
	char (*canon)[16];
};

static bool names_init(struct names *m, const struct mo_tp *prog)
{
	memset(m, 0, sizeof *m);
	m->prog = prog;
	m->num = mo_calloc((size_t)prog->n_tensors + 1, sizeof *m->num);
	if (!m->num)
		return false;
	m->n = canon_numbers(prog, m->num);
	m->name = mo_calloc((size_t)m->n + 1, sizeof *m->name);
	m->canon = mo_calloc((size_t)m->n + 1, sizeof *m->canon);
	if (!m->name || !m->canon)
		return false;
	for (int t = 0; t < prog->n_tensors; t++)
		if (m->num[t])
			m->name[m->num[t] - 1] = prog->tensors[t].name;
	for (int c = 0; c < m->n; c++)
		snprintf(m->canon[c], sizeof m->canon[c], "c%d", c + 1);
	return true;
}

static void names_free(struct names *m)
{
	mo_free(m->num);
	mo_free((void *)m->name);
	mo_free(m->canon);
}

/* A pair of namings: a name of `from` to the same tensor's in `to`. A
 * NULL side means the canonical names. */
struct renaming {
	const struct names *from, *to;
};

static const char *rename_one(void *ctx, const char *name)
{
	const struct renaming *r = ctx;
	const struct names *f = r->from ? r->from : r->to, *t = r->to ? r->to : r->from;
	int c = -1;
	for (int i = 0; i < f->n && c < 0; i++)
		if (!strcmp(r->from ? f->name[i] : f->canon[i], name))
			c = i;
	if (c < 0 || c >= t->n)
		return NULL;
	return r->to ? t->name[c] : t->canon[c];
}

static bool rename_mg(struct mo_mugraph *mg, const struct names *from, const struct names *to)
{
	struct renaming r = { from, to };
	return mo_mg_rename(mg, rename_one, &r);
}

/* A copy of mg, its tensors renamed from one naming to another (NULL: the
 * canonical names), through its JSON; NULL with why. */
static struct mo_mugraph *renamed_copy(const struct mo_mugraph *mg, const struct names *from,
				       const struct names *to, char *why, size_t why_len)
{
	struct mo_mugraph *copy = NULL;
	struct mo_diag d;
	mo_diag_init(&d);
	char *text = mo_mg_json(mg);
	snprintf(why, why_len, "out of memory");
	if (text && mo_mg_from_json(text, &copy, &d))
		snprintf(why, why_len, "%.300s", d.msg);
	else if (copy && !rename_mg(copy, from, to)) {
		snprintf(why, why_len, "its tensors are not the region's");
		mo_mg_free(copy);
		copy = NULL;
	}
	free(text);
	return copy;
}

/* A copy of mg (found for region `from`) named as region `to`'s tensors;
 * NULL with why. */
static struct mo_mugraph *copy_for(const struct mo_mugraph *mg, const struct mo_tp *from,
				   const struct mo_tp *to, char *why, size_t why_len)
{
	struct names nf = { 0 }, nt = { 0 };
	struct mo_mugraph *copy = NULL;
	if (names_init(&nf, from) && names_init(&nt, to))
		copy = renamed_copy(mg, &nf, &nt, why, why_len);
	else
		snprintf(why, why_len, "out of memory");
	names_free(&nf);
	names_free(&nt);
	return copy;
}

bool mo_search_cache_dir(char *buf, size_t len, char *why, size_t why_len)
{
	const char *env = getenv("MIRAGE_ONNX_CACHE");
	const char *home = getenv("HOME");
	why[0] = 0;
	int n;
	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if (home && *home)
		n = snprintf(buf, len, "%s/.cache/mirage-onnx", home);
	else
		return false; /* nowhere to keep one: said by --help */
	if (n < 0 || (size_t)n >= len) {
		snprintf(why, why_len, "its path is longer than %zu bytes", len - 1);
		return false;
	}
	char parent[1024];
	snprintf(parent, sizeof parent, "%s", buf);
	char *slash = strrchr(parent, '/');
	if (slash && slash != parent) {
		*slash = 0;
		mkdir(parent, 0755);
	}
	struct stat st;
	if (mkdir(buf, 0755) != 0 && errno != EEXIST)
		snprintf(why, why_len, "%s", strerror(errno));
	else if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
		snprintf(why, why_len, "not a folder");
	else if (access(buf, W_OK | X_OK) != 0)
		snprintf(why, why_len, "not writable: %s", strerror(errno));
	return !why[0];
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

/* Adopts mg (named as prog's tensors) as prog's best when it fits the
 * region and passes the full verdict again: the cache is never trusted.
 * Else frees it and says why. */
static bool reverify(struct mo_mugraph *mg, const struct mo_tp *prog,
		     const struct mo_search_options *o, struct mo_search_result *r, char *why,
		     size_t why_len)
{
	const struct mo_gpu *gpu = o->gpu ? o->gpu : mo_gpu_of_target(o->target);
	struct mo_equiv_options eo = MO_EQUIV_DEFAULTS;
	eo.seed = o->seed;
	struct mo_diag quiet;
	mo_diag_init(&quiet);
	if (entry_fits(mg, prog, why, why_len) && mo_search_mg_valid(mg, o, why, why_len)) {
		if (mo_mg_equiv(mg, prog, &eo, &r->verification, &quiet))
			snprintf(why, why_len, "it cannot be verified: %.200s", quiet.msg);
		else if (r->verification.verdict != MO_EQUIVALENT)
			snprintf(why, why_len, "it is not equivalent to the region");
		else {
			r->best = mg;
			mo_cost_mugraph(mg, gpu, &r->cost_best);
			mo_cost_program(prog, gpu, &r->cost_unfused);
			return true;
		}
		memset(&r->verification, 0, sizeof r->verification);
	}
	mo_mg_free(mg);
	return false;
}

bool mo_search_reuse(const struct mo_tp *prog, const struct mo_search_options *o,
		     const struct mo_mugraph *found, const struct mo_tp *found_for,
		     struct mo_search_result *r, char *why, size_t why_len)
{
	memset(r, 0, sizeof *r);
	if (mo_search_region_key(prog, o) != mo_search_region_key(found_for, o)) {
		snprintf(why, why_len, "the regions differ");
		return false;
	}
	struct mo_mugraph *mg = copy_for(found, found_for, prog, why, why_len);
	return mg && reverify(mg, prog, o, r, why, why_len);
}

/* Whether a kernel-graph input of mg is named `name`. */
static bool reads(const struct mo_mugraph *mg, const char *name)
{
	for (int i = 0; i < mg->kg.n_inputs; i++)
		if (!strcmp(mg->kg.tensors[mg->kg.inputs[i]].name, name))
			return true;
	return false;
}

uint64_t mo_search_mugraph_key(const struct mo_tp *prog, const struct mo_search_options *o,
			       const struct mo_mugraph *mg)
{
	uint64_t h = mo_search_region_key(prog, o);
	struct names n = { 0 };
	struct mo_mugraph *copy = NULL;
	char *canon = NULL, why[320];
	if (names_init(&n, prog) && (copy = renamed_copy(mg, &n, NULL, why, sizeof why)) &&
	    (canon = mo_mg_json(copy)))
		h = mo_fnv(h, canon, strlen(canon));
	else /* a type of its own */
		h = mo_fnv(h, &mg, sizeof mg);
	/* What a fused op's function body holds as constants (the weights and
	 * constants the region reads that are not the op's inputs, its ops'
	 * constant operands): the same op type only with the same ones, by
	 * value when small, else by name. */
	for (int k = 0; k < prog->n_ops; k++) {
		const struct mo_tp_op *op = &prog->ops[k];
		for (int i = 0; i < op->n_in + op->n_params; i++) {
			int t = i < op->n_in ? op->in[i] : op->param_in[i - op->n_in];
			if (t < 0)
				continue;
			const struct mo_tensor *x = &prog->tensors[t];
			if (x->kind == MO_T_VALUE || x->kind == MO_T_INPUT || reads(mg, x->name))
				continue;
			if (!hash_values(&h, prog, x, OP_KEY_MAX_VALUES))
				h = mo_fnv(h, x->name, strlen(x->name));
		}
	}
	mo_mg_free(copy);
	free(canon);
	names_free(&n);
	return h;
}

/* Writes mg (found for prog) as a cache entry, under the canonical names. */
static void cache_store(const struct mo_mugraph *mg, const struct mo_tp *prog, const char *path)
{
	struct names n = { 0 };
	struct mo_mugraph *copy = NULL;
	char why[320];
	struct mo_diag ignored; /* a cache entry is optional */
	mo_diag_init(&ignored);
	if (names_init(&n, prog) && (copy = renamed_copy(mg, &n, NULL, why, sizeof why)))
		(void)mo_mg_write_json(copy, path, &ignored);
	mo_mg_free(copy);
	names_free(&n);
}

/* ---- entries saying that a search found nothing ----
 * "<key>.none": a search of the region with some budget found no μGraph,
 * and which runs of its ops fuse on their own. Read only for a search with
 * at most that budget (a larger one may find more), never for a search the
 * safety net or the time limit stopped; parsed strictly, since the folder
 * is the user's. Lines: the header, "budget S", "parts N P0 .. P(n_ops-1)"
 * and "why TEXT". */
#define NONE_HEADER "mirage-onnx search: no μGraph"
#define NONE_MAX_BYTES (1u << 20)

static void none_path(const char *path, char *out, size_t len)
{
	snprintf(out, len, "%.*s.none", (int)(strlen(path) - strlen(".json")), path);
}

static void none_store(const struct mo_search_result *r, const struct mo_tp *prog,
		       const struct mo_search_options *o, const char *path)
{
	char np[1200];
	none_path(path, np, sizeof np);
	struct mo_file mf;
	struct mo_diag ignored;
	mo_diag_init(&ignored);
	if (mo_file_open(&mf, np, &ignored))
		return;
	fprintf(mf.f, "%s\nbudget %.17g\nparts %d", NONE_HEADER, o->budget_s, r->n_parts);
	for (int k = 0; k < prog->n_ops; k++)
		fprintf(mf.f, " %d", r->n_parts > 0 && r->part_of ? r->part_of[k] : -1);
	fputs("\nwhy ", mf.f);
	for (const char *c = r->why; *c; c++) /* one line */
		fputc(*c == '\n' || *c == '\r' ? ' ' : *c, mf.f);
	fputc('\n', mf.f);
	(void)mo_file_commit(&mf, &ignored);
}

/* A long from *p (then past it and one space), within [lo, hi]. */
static bool none_int(const char **p, long lo, long hi, long *v)
{
	char *end;
	errno = 0;
	*v = strtol(*p, &end, 10);
	if (end == *p || errno || *v < lo || *v > hi || (*end != ' ' && *end != '\n'))
		return false;
	*p = end + (*end == ' ');
	return true;
}

/* The entry at np for prog searched with o: true with r filled (why, the
 * runs of ops) when it is valid and its budget at least o's; false with why
 * set when it is invalid, empty when there is none or its budget is less. */
static bool none_load(const char *np, const struct mo_tp *prog, const struct mo_search_options *o,
		      struct mo_search_result *r, char *why, size_t why_len)
{
	why[0] = 0;
	FILE *f = fopen(np, "rb");
	if (!f)
		return false;
	char *text = mo_malloc(NONE_MAX_BYTES + 1);
	size_t len = text ? fread(text, 1, NONE_MAX_BYTES + 1, f) : 0;
	fclose(f);
	if (!text || len > NONE_MAX_BYTES || memchr(text, 0, len)) {
		snprintf(why, why_len, "%s", text ? "not an entry" : "out of memory reading it");
		mo_free(text);
		return false;
	}
	text[len] = 0;
	const char *p = text;
	double budget = 0;
	long n_parts = 0, v;
	int *part_of = mo_malloc(sizeof *part_of * ((size_t)prog->n_ops + 1));
	bool ok = part_of && !strncmp(p, NONE_HEADER "\nbudget ", strlen(NONE_HEADER) + 8);
	if (ok) {
		char *end;
		p += strlen(NONE_HEADER) + 8;
		budget = strtod(p, &end);
		ok = end != p && *end == '\n' && budget >= 0 && budget <= 1e9;
		p = end + 1;
	}
	ok = ok && !strncmp(p, "parts ", 6);
	p += ok ? 6 : 0;
	ok = ok && none_int(&p, 0, prog->n_ops, &n_parts);
	for (int k = 0; ok && k < prog->n_ops; k++) {
		ok = none_int(&p, -1, n_parts - 1, &v);
		if (ok)
			part_of[k] = (int)v;
	}
	ok = ok && *p == '\n' && !strncmp(p + 1, "why ", 4);
	const char *w = ok ? p + 5 : NULL, *nl = w ? strchr(w, '\n') : NULL;
	ok = ok && nl && nl[1] == 0 && nl > w;
	if (!ok) {
		snprintf(why, why_len, "not an entry for this region");
	} else if (o->budget_s <= budget) {
		memset(r, 0, sizeof *r);
		snprintf(r->why, sizeof r->why, "%.*s", (int)(nl - w), w);
		r->n_parts = (int)n_parts;
		r->part_of = n_parts > 0 ? part_of : NULL;
		if (n_parts > 0)
			part_of = NULL;
	} else {
		ok = false; /* searched with less: search again */
	}
	mo_free(part_of);
	mo_free(text);
	return ok;
}

static enum mo_status find_mugraph(const struct mo_tp *prog, const struct mo_search_options *o,
				   const char *cache, struct mo_search_result *r, bool *cached,
				   struct mo_diag *d)
{
	memset(r, 0, sizeof *r);
	*cached = false;
	char path[1100];
	if ((o->time_limit > 0 && mo_seconds() > o->time_limit) ||
	    !mo_search_memory_fits(prog, o, r->why, sizeof r->why))
		cache = NULL; /* past the run's time limit or its memory: mo_search says so */
	if (cache) {
		cache_path(prog, o, cache, path, sizeof path);
		char why[320];
		struct mo_mugraph *mg = cache_load(path, why, sizeof why);
		struct names n = { 0 };
		if (mg && !(names_init(&n, prog) && rename_mg(mg, NULL, &n))) {
			snprintf(why, sizeof why, "its tensors are not the region's");
			mo_mg_free(mg);
			mg = NULL;
		}
		names_free(&n);
		bool entry = mg != NULL; /* reverify frees a μGraph it does not adopt */
		if (entry && reverify(mg, prog, o, r, why, sizeof why)) {
			*cached = true;
			return MO_OK;
		}
		char np[1200];
		const char *said = path;
		none_path(path, np, sizeof np);
		if (!entry && !why[0]) { /* no μGraph entry: one saying none was found? */
			if (none_load(np, prog, o, r, why, sizeof why)) {
				*cached = true;
				return MO_OK;
			}
			said = np;
		}
		if (why[0]) {
			for (char *c = why; *c; c++) /* one line */
				if (*c == '\n' || *c == '\r')
					*c = ' ';
			mo_progressf(o->warning, o->warning_ctx, "cache entry %s ignored (%s); "
				     "searching again", said, why);
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
	if (!st && cache) {
		char np[1200];
		cache_path(prog, o, cache, path, sizeof path);
		none_path(path, np, sizeof np);
		bool whole = !r->stats.safety_net && !r->stats.time_limit &&
			     mo_alloc_failures() == failures;
		remove(path); /* an invalid entry is not read again */
		remove(np);
		if (whole && r->best)
			cache_store(r->best, prog, path);
		else if (whole)
			none_store(r, prog, o, path);
	}
	return st;
}
