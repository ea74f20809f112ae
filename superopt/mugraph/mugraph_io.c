/* μGraphs to and from JSON (the build steps), and to Graphviz. */
#include "mo_mugraph.h"

#include <ctype.h>
#include <inttypes.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *step_names[] = {
	[MO_STEP_INPUT] = "input", [MO_STEP_KERNEL] = "kernel", [MO_STEP_OUTPUT] = "output",
	[MO_STEP_BLOCK] = "block", [MO_STEP_ITER] = "iter", [MO_STEP_OP] = "op",
	[MO_STEP_CONST] = "const", [MO_STEP_ACCUM] = "accum", [MO_STEP_SAVE] = "save",
	[MO_STEP_THREAD] = "thread",
};

static const char *accum_names[] = {
	[MO_ACC_SUM] = "sum", [MO_ACC_MAX] = "max", [MO_ACC_RESCALED] = "rescaled",
};

/* Slice starts and ends are clamped to a dim's extent, which is far below
 * this bound: ONNX's INT64_MAX ("to the end") is written as the bound, which
 * JSON's numbers (doubles) hold exactly and the reader accepts. */
#define MAX_COORD ((int64_t)1 << 62)

static void ints(FILE *out, const char *key, const int64_t *v, int n)
{
	fprintf(out, ", \"%s\": [", key);
	for (int i = 0; i < n; i++)
		fprintf(out, "%s%" PRId64, i ? ", " : "", v[i]);
	fputc(']', out);
}

static void int3(FILE *out, const char *key, const int *v, int n)
{
	int64_t w[3];
	for (int i = 0; i < n; i++)
		w[i] = v[i];
	ints(out, key, w, n);
}

/* Only the params an op reads, so the text stays readable. */
static void params(FILE *out, const struct mo_mg_step *s)
{
	const struct mo_op_params *p = &s->p;
	if (p->n_axes)
		ints(out, "axes", p->axes, p->n_axes);
	if (p->keepdims)
		fprintf(out, ", \"keepdims\": 1");
	if (p->noop_with_empty_axes)
		fprintf(out, ", \"noop_with_empty_axes\": 1");
	if (p->allowzero)
		fprintf(out, ", \"allowzero\": 1");
	if (s->op == MO_OP_GELU)
		fprintf(out, ", \"approximate\": \"%s\"",
			p->approximate == MO_GELU_TANH ? "tanh" : "none");
	if (p->trans_a || p->trans_b)
		fprintf(out, ", \"trans_a\": %d, \"trans_b\": %d", p->trans_a, p->trans_b);
	if (s->op == MO_OP_GEMM || p->alpha || p->beta || p->gamma)
		fprintf(out, ", \"alpha\": %.17g, \"beta\": %.17g", p->alpha, p->beta);
	if (p->gamma)
		fprintf(out, ", \"gamma\": %.17g", p->gamma);
	if (p->epsilon != 0)
		fprintf(out, ", \"epsilon\": %.17g", p->epsilon);
	if (p->has_exponent)
		fprintf(out, ", \"exponent\": %.17g", p->exponent);
	if (p->to)
		fprintf(out, ", \"to\": %d", p->to);
	if (p->has_clip_min)
		fprintf(out, ", \"clip_min\": %.17g", p->clip_min);
	if (p->has_clip_max)
		fprintf(out, ", \"clip_max\": %.17g", p->clip_max);
	if (s->op == MO_OP_SLICE) {
		int64_t c[2][MO_MAX_RANK];
		for (int i = 0; i < p->n_axes; i++) {
			const int64_t v[2] = { p->starts[i], p->ends[i] };
			for (int k = 0; k < 2; k++)
				c[k][i] = v[k] > MAX_COORD ? MAX_COORD : v[k] < -MAX_COORD ? -MAX_COORD : v[k];
		}
		ints(out, "starts", c[0], p->n_axes);
		ints(out, "ends", c[1], p->n_axes);
		ints(out, "steps", p->steps, p->n_axes);
	}
	if (p->n_sizes)
		ints(out, "sizes", s->sizes, p->n_sizes);
}

void mo_mg_print_json(const struct mo_mugraph *mg, FILE *out)
{
	fputs("{\"steps\": [", out);
	for (int i = 0; i < mg->n_steps; i++) {
		const struct mo_mg_step *s = &mg->steps[i];
		fprintf(out, "%s\n  {\"step\": \"%s\"", i ? "," : "", step_names[s->kind]);
		if (s->block >= 0)
			fprintf(out, ", \"block\": %d", s->block);
		switch (s->kind) {
		case MO_STEP_INPUT:
			fputs(", \"name\": ", out);
			mo_json_string(out, s->name);
			fprintf(out, ", \"dtype\": %d", s->dtype);
			ints(out, "shape", s->dims, s->rank);
			break;
		case MO_STEP_OUTPUT:
			fprintf(out, ", \"tensor\": %d, \"name\": ", s->in[0]);
			mo_json_string(out, s->name);
			break;
		case MO_STEP_BLOCK:
			int3(out, "grid", s->grid, 3);
			fprintf(out, ", \"forloop\": %d", s->forloop);
			break;
		case MO_STEP_ITER:
			fprintf(out, ", \"tensor\": %d", s->in[0]);
			int3(out, "imap", s->map, 3);
			fprintf(out, ", \"fmap\": %d", s->fmap);
			break;
		case MO_STEP_KERNEL:
		case MO_STEP_OP:
			fprintf(out, ", \"op\": \"%s\"", mo_op_table[s->op].name);
			int3(out, "in", s->in, s->n_in);
			params(out, s);
			break;
		case MO_STEP_CONST:
			if (isinf(s->value)) /* JSON has no infinity: a string */
				fprintf(out, ", \"value\": \"%s\"", s->value < 0 ? "-inf" : "inf");
			else
				fprintf(out, ", \"value\": %.17g", s->value);
			break;
		case MO_STEP_ACCUM:
			fprintf(out, ", \"tile\": %d, \"kind\": \"%s\"", s->in[0],
				accum_names[s->fmap]);
			if (s->fmap == MO_ACC_RESCALED)
				fprintf(out, ", \"max\": %d", s->in[1]);
			break;
		case MO_STEP_THREAD:
			fprintf(out, ", \"first\": %d, \"last\": %d", s->in[0], s->in[1]);
			break;
		case MO_STEP_SAVE:
			fprintf(out, ", \"tile\": %d", s->in[0]);
			int3(out, "omap", s->map, 3);
			if (s->range.hi) /* a ranged saver: [grid dim, first block, end] */
				int3(out, "range", (const int[3]){ s->range.dim, s->range.lo,
								     s->range.hi }, 3);
			break;
		}
		fputc('}', out);
	}
	fputs("]}\n", out);
}

/* ---- a small JSON reader: numbers, strings, arrays, objects ---- */

enum jt { J_NUM, J_STR, J_ARR, J_OBJ, J_LIT };

struct jv {
	enum jt t;
	double num;
	char *str;
	int n;
	struct jv *items;
	char **keys;
};

struct reader {
	const char *s;
	struct mo_arena *a;
	const char *err;
	int depth;
};

static void ws(struct reader *r)
{
	while (isspace((unsigned char)*r->s))
		r->s++;
}

static bool parse(struct reader *r, struct jv *v);

static bool parse_string(struct reader *r, char **out)
{
	if (*r->s != '"') {
		r->err = "expected a string";
		return false;
	}
	const char *start = ++r->s;
	size_t n = 0;
	for (const char *c = start; *c != '"'; c++, n++) {
		if (!*c) {
			r->err = "unterminated string";
			return false;
		}
		if (*c == '\\' && c[1])
			c++;
	}
	char *buf = mo_arena_alloc(r->a, n + 1);
	if (!buf) {
		r->err = "out of memory";
		return false;
	}
	size_t k = 0;
	while (*r->s != '"') {
		char c = *r->s++;
		if (c == '\\') {
			c = *r->s++;
			if (c == 'n')
				c = '\n';
			else if (c == 't')
				c = '\t';
			else if (c == 'u') { /* \u00XX only: what the writer emits */
				unsigned x = 0;
				for (int i = 0; i < 4 && isxdigit((unsigned char)*r->s); i++, r->s++)
					x = x * 16 + (unsigned)(isdigit((unsigned char)*r->s)
						? *r->s - '0' : (tolower((unsigned char)*r->s) - 'a' + 10));
				c = (char)x;
			}
		}
		buf[k++] = c;
	}
	buf[k] = '\0';
	r->s++;
	*out = buf;
	return true;
}

static bool parse_list(struct reader *r, struct jv *v, bool object)
{
	char close = object ? '}' : ']';
	r->s++;
	int cap = 8;
	v->t = object ? J_OBJ : J_ARR;
	v->items = mo_arena_array(r->a, (size_t)cap, sizeof *v->items);
	v->keys = object ? mo_arena_array(r->a, (size_t)cap, sizeof *v->keys) : NULL;
	ws(r);
	if (*r->s == close) {
		r->s++;
		return true;
	}
	for (;;) {
		if (v->n == cap) {
			cap *= 2;
			struct jv *items = mo_arena_array(r->a, (size_t)cap, sizeof *items);
			char **keys = object ? mo_arena_array(r->a, (size_t)cap, sizeof *keys) : NULL;
			if (!items || (object && !keys)) {
				r->err = "out of memory";
				return false;
			}
			memcpy(items, v->items, (size_t)v->n * sizeof *items);
			if (object)
				memcpy(keys, v->keys, (size_t)v->n * sizeof *keys);
			v->items = items;
			v->keys = keys;
		}
		ws(r);
		if (object) {
			if (!parse_string(r, &v->keys[v->n]))
				return false;
			ws(r);
			if (*r->s++ != ':') {
				r->err = "expected ':'";
				return false;
			}
		}
		if (!parse(r, &v->items[v->n]))
			return false;
		v->n++;
		ws(r);
		if (*r->s == ',') {
			r->s++;
			continue;
		}
		if (*r->s == close) {
			r->s++;
			return true;
		}
		r->err = object ? "expected ',' or '}'" : "expected ',' or ']'";
		return false;
	}
}

static bool parse(struct reader *r, struct jv *v)
{
	memset(v, 0, sizeof *v);
	if (++r->depth > 32) {
		r->err = "nested too deeply";
		return false;
	}
	ws(r);
	bool ok;
	if (*r->s == '{' || *r->s == '[') {
		ok = parse_list(r, v, *r->s == '{');
	} else if (*r->s == '"') {
		v->t = J_STR;
		ok = parse_string(r, &v->str);
	} else if (!strncmp(r->s, "true", 4) || !strncmp(r->s, "null", 4)) {
		v->t = J_LIT;
		r->s += 4;
		ok = true;
	} else if (!strncmp(r->s, "false", 5)) {
		v->t = J_LIT;
		r->s += 5;
		ok = true;
	} else {
		char *end;
		v->t = J_NUM;
		v->num = strtod(r->s, &end);
		ok = end != r->s;
		if (!ok)
			r->err = "unexpected character";
		r->s = end;
	}
	r->depth--;
	return ok;
}

static const struct jv *get(const struct jv *o, const char *key)
{
	for (int i = 0; o->t == J_OBJ && i < o->n; i++)
		if (!strcmp(o->keys[i], key))
			return &o->items[i];
	return NULL;
}

/* ---- reading it back: every field checked before a builder sees it ----
 *
 * The text may come from a cache directory anyone can write to, so nothing
 * in it is trusted: a key of the wrong type, a number that is not an
 * integer of the expected range (1e308, NaN, -1 where a size goes), an op
 * with the wrong number of operands, a step of a block that does not exist,
 * is an error with the step's number, never a default. */

/* Bounds of what a μGraph holds: tensor and tile numbers, dims, grids. */
#define MAX_INDEX (MO_MG_MAX - 1)
#define MAX_DIM ((int64_t)1 << 40)
#define MAX_GRID (1 << 20)
#define MAX_DTYPE 23                 /* ONNX TensorProto.DataType */

struct step_reader {
	const struct jv *s;
	char *err;         /* the μGraph's error buffer */
	size_t err_len;
	int i;             /* step number */
};

static bool bad(struct step_reader *sr, const char *key, const char *what)
{
	if (!sr->err[0])
		snprintf(sr->err, sr->err_len, "step %d: \"%s\" %s", sr->i, key, what);
	return false;
}

static bool is_int(const struct jv *v, int64_t lo, int64_t hi)
{
	return v->t == J_NUM && isfinite(v->num) && v->num == floor(v->num) &&
	       v->num >= (double)lo && v->num <= (double)hi;
}

/* A required integer in [lo, hi]. */
static bool req_int(struct step_reader *sr, const char *key, int64_t lo, int64_t hi,
		    int64_t *out)
{
	const struct jv *v = get(sr->s, key);
	if (!v)
		return bad(sr, key, "is missing");
	if (!is_int(v, lo, hi))
		return bad(sr, key, "is not an integer in range");
	*out = (int64_t)v->num;
	return true;
}

static bool req_i(struct step_reader *sr, const char *key, int lo, int hi, int *out)
{
	int64_t w;
	if (!req_int(sr, key, lo, hi, &w))
		return false;
	*out = (int)w;
	return true;
}

/* An optional integer in [lo, hi]; dflt when absent. */
static bool opt_i(struct step_reader *sr, const char *key, int lo, int hi, int dflt, int *out)
{
	if (!get(sr->s, key)) {
		*out = dflt;
		return true;
	}
	return req_i(sr, key, lo, hi, out);
}

/* An optional finite number with |x| <= max; *has says whether it is there. */
static bool opt_real(struct step_reader *sr, const char *key, double max, double *out,
		     bool *has)
{
	const struct jv *v = get(sr->s, key);
	*has = v != NULL;
	if (!v)
		return true;
	if (v->t != J_NUM || !isfinite(v->num) || fabs(v->num) > max)
		return bad(sr, key, "is not a finite number in range");
	*out = v->num;
	return true;
}

/* An integer array of n_min..n_max entries, each in [lo, hi]; its length. A
 * missing optional array has length 0. */
static bool int_array(struct step_reader *sr, const char *key, bool required, int n_min,
		      int n_max, int64_t lo, int64_t hi, int64_t *out, int *n)
{
	const struct jv *v = get(sr->s, key);
	*n = 0;
	if (!v)
		return required ? bad(sr, key, "is missing") : true;
	if (v->t != J_ARR || v->n < n_min || v->n > n_max)
		return bad(sr, key, "is not an array of the right length");
	for (int i = 0; i < v->n; i++) {
		if (!is_int(&v->items[i], lo, hi))
			return bad(sr, key, "has an entry that is not an integer in range");
		out[i] = (int64_t)v->items[i].num;
	}
	*n = v->n;
	return true;
}

/* A map of the three grid dims (or a grid itself) as ints. */
static bool int3_array(struct step_reader *sr, const char *key, int lo, int hi, int *out)
{
	int64_t w[3];
	int n;
	if (!int_array(sr, key, true, 3, 3, lo, hi, w, &n))
		return false;
	for (int i = 0; i < 3; i++)
		out[i] = (int)w[i];
	return true;
}

static bool req_str(struct step_reader *sr, const char *key, const char **out)
{
	const struct jv *v = get(sr->s, key);
	if (!v)
		return bad(sr, key, "is missing");
	if (v->t != J_STR || !v->str[0] || strlen(v->str) > 4096)
		return bad(sr, key, "is not a name");
	*out = v->str;
	return true;
}

/* How many operands an op of a μGraph takes (its builders make one output,
 * so ops of several outputs, and the region boundaries, take none). */
static void arity(enum mo_op op, int *lo, int *hi)
{
	*lo = *hi = 1;
	switch (op) {
	case MO_OP_MATMUL: case MO_OP_ADD: case MO_OP_SUB: case MO_OP_MUL: case MO_OP_DIV:
		*lo = *hi = 2;
		break;
	case MO_OP_GEMM:
		*lo = 2;
		*hi = 3;
		break;
	case MO_OP_MAX: case MO_OP_MIN:
		*lo = 2;
		*hi = 3;
		break;
	case MO_OP_WHERE:
		*lo = *hi = 3;
		break;
	case MO_OP_LESS: case MO_OP_LESS_EQUAL: case MO_OP_GREATER: case MO_OP_GREATER_EQUAL:
	case MO_OP_EQUAL: case MO_OP_AND: case MO_OP_OR:
		*lo = *hi = 2;
		break;
	case MO_OP_CLIP: case MO_OP_LAYER_NORM: case MO_OP_CONCAT:
		*hi = 3;
		break;
	case MO_OP_RMS_NORM:
		*hi = 2;
		break;
	case MO_OP_NEG: case MO_OP_RECIPROCAL: case MO_OP_POW: case MO_OP_SQRT: case MO_OP_EXP:
	case MO_OP_SIGMOID: case MO_OP_SOFTMAX: case MO_OP_REDUCE_SUM: case MO_OP_REDUCE_MEAN:
	case MO_OP_REDUCE_MAX: case MO_OP_TRANSPOSE: case MO_OP_RESHAPE: case MO_OP_SQUEEZE:
	case MO_OP_UNSQUEEZE: case MO_OP_FLATTEN: case MO_OP_SLICE: case MO_OP_EXPAND:
	case MO_OP_IDENTITY: case MO_OP_CAST: case MO_OP_RELU: case MO_OP_ERF: case MO_OP_GELU:
	case MO_OP_TANH: case MO_OP_ABS: case MO_OP_COS: case MO_OP_SIN: case MO_OP_LOG:
	case MO_OP_NOT: case MO_OP_IS_NAN:
	MO_ACTIVATION_CASES
		break;
	case MO_OP_SPLIT: case MO_OP_GATHER: case MO_OP_OPAQUE: case MO_OP__COUNT:
		*lo = *hi = 0;
		break;
	}
}

static bool read_params(struct step_reader *sr, enum mo_op op, struct mo_op_params *p,
			int64_t *sizes)
{
	memset(p, 0, sizeof *p);
	bool has;
	int n;
	if (!int_array(sr, "axes", false, 0, MO_MAX_RANK, -MO_MAX_RANK, MO_MAX_RANK - 1, p->axes,
		       &p->n_axes) ||
	    !opt_i(sr, "keepdims", 0, 1, 0, &p->keepdims) ||
	    !opt_i(sr, "noop_with_empty_axes", 0, 1, 0, &p->noop_with_empty_axes) ||
	    !opt_i(sr, "allowzero", 0, 1, 0, &p->allowzero) ||
	    !opt_i(sr, "trans_a", 0, 1, 0, &p->trans_a) ||
	    !opt_i(sr, "trans_b", 0, 1, 0, &p->trans_b) ||
	    !opt_real(sr, "alpha", 1e30, &p->alpha, &has) ||
	    !opt_real(sr, "beta", 1e30, &p->beta, &has) ||
	    !opt_real(sr, "gamma", 1e30, &p->gamma, &has) ||
	    !opt_real(sr, "epsilon", 1, &p->epsilon, &has) ||
	    !opt_real(sr, "exponent", 64, &p->exponent, &p->has_exponent) ||
	    !opt_real(sr, "clip_min", DBL_MAX, &p->clip_min, &p->has_clip_min) ||
	    !opt_real(sr, "clip_max", DBL_MAX, &p->clip_max, &p->has_clip_max) ||
	    !opt_i(sr, "to", 0, MAX_DTYPE, 0, &p->to))
		return false;
	if (p->epsilon < 0)
		return bad(sr, "epsilon", "is negative");
	if (op == MO_OP_POW && !p->has_exponent)
		return bad(sr, "exponent", "is missing");
	const struct jv *ap = get(sr->s, "approximate");
	if (ap) {
		if (ap->t != J_STR || (strcmp(ap->str, "none") && strcmp(ap->str, "tanh")))
			return bad(sr, "approximate", "is neither \"none\" nor \"tanh\"");
		p->approximate = strcmp(ap->str, "tanh") == 0 ? MO_GELU_TANH : MO_GELU_NONE;
	}
	if (op == MO_OP_SLICE || get(sr->s, "starts")) {
		int n_e, n_s;
		if (!int_array(sr, "starts", true, p->n_axes, p->n_axes, -MAX_COORD, MAX_COORD,
			       p->starts, &n) ||
		    !int_array(sr, "ends", true, p->n_axes, p->n_axes, -MAX_COORD, MAX_COORD, p->ends,
			       &n_e) ||
		    !int_array(sr, "steps", true, p->n_axes, p->n_axes, -MAX_COORD, MAX_COORD,
			       p->steps, &n_s))
			return false;
		for (int i = 0; i < n_s; i++)
			if (!p->steps[i])
				return bad(sr, "steps", "has a zero step");
	}
	if (!int_array(sr, "sizes", false, 0, MO_MAX_RANK, -1, MAX_DIM, sizes, &n))
		return false;
	if (n > 0) {
		p->n_sizes = n;
		p->sizes = sizes;
	}
	return true;
}

char *mo_mg_json(const struct mo_mugraph *mg)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);
	if (!f)
		return NULL;
	mo_mg_print_json(mg, f);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

enum mo_status mo_mg_write_json(const struct mo_mugraph *mg, const char *path, struct mo_diag *d)
{
	struct mo_file mf;
	enum mo_status st = mo_file_open(&mf, path, d);
	if (st)
		return st;
	mo_mg_print_json(mg, mf.f);
	return mo_file_commit(&mf, d);
}

/* The kernel (index into mg->ops) that makes kernel-level tensor t, or -1
 * for an input. */
static int maker(const struct mo_mugraph *mg, int t)
{
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) {
			if (op->op.n_out > 0 && op->op.out[0] == t)
				return k;
			continue;
		}
		for (int s = 0; s < op->bg->n_savers; s++)
			if (op->bg->savers[s].tensor == t)
				return k;
	}
	return -1;
}

/* What the builders cannot see step by step: a kernel reads only tensors
 * that inputs or earlier kernels make (a block's steps may come after later
 * kernels' steps, so an iterator could name a tensor made after it), and
 * every block saves something. */
static void check_order(struct mo_mugraph *mg)
{
	for (int k = 0; k < mg->n_ops && !mg->error[0]; k++) {
		const struct mo_block_graph *bg = mg->ops[k].bg;
		if (!bg)
			continue;
		for (int i = 0; i < bg->n_iters; i++)
			if (maker(mg, bg->iters[i].tensor) >= k)
				snprintf(mg->error, sizeof mg->error, "kernel %d reads a tensor that it or a "
					 "later kernel makes", k + 1);
		if (!bg->n_savers)
			snprintf(mg->error, sizeof mg->error, "kernel %d saves nothing", k + 1);
	}
	if (!mg->error[0] && !mg->kg.n_outputs)
		snprintf(mg->error, sizeof mg->error, "no output");
}

static void read_step(struct mo_mugraph *mg, struct step_reader *sr)
{
	const struct jv *s = sr->s;
	const char *k = "";
	if (s->t != J_OBJ) {
		bad(sr, "step", "is not in an object");
		return;
	}
	if (!req_str(sr, "step", &k))
		return;
	bool in_block = strcmp(k, "input") && strcmp(k, "output") && strcmp(k, "kernel") &&
			strcmp(k, "block");
	struct mo_block_graph *bg = NULL;
	if (in_block) {
		int b;
		if (!req_i(sr, "block", 0, MAX_INDEX, &b))
			return;
		if (b >= mg->n_blocks)
			return (void)bad(sr, "block", "names a block not made yet");
		bg = mg->blocks[b];
	} else if (get(s, "block")) {
		return (void)bad(sr, "block", "is not expected in this step");
	}
	int64_t dims[MO_MAX_RANK], sizes[MO_MAX_RANK];
	int m[3], t, u, n;
	const char *name;
	if (!strcmp(k, "input")) {
		if (req_str(sr, "name", &name) && req_i(sr, "dtype", 1, MAX_DTYPE, &t) &&
		    int_array(sr, "shape", true, 0, MO_MAX_RANK, 0, MAX_DIM, dims, &n))
			mo_mg_input(mg, name, t, n, dims);
	} else if (!strcmp(k, "output")) {
		if (mg->kg.n_outputs == MO_MG_MAX)
			bad(sr, "output", "is one too many");
		else if (req_i(sr, "tensor", 0, MAX_INDEX, &t) && req_str(sr, "name", &name))
			mo_mg_output(mg, t, name);
	} else if (!strcmp(k, "block")) {
		if (int3_array(sr, "grid", 1, MAX_GRID, m) && req_i(sr, "forloop", 1, MAX_GRID, &t))
			mo_mg_block(mg, m[0], m[1], m[2], t);
	} else if (!strcmp(k, "iter")) {
		if (req_i(sr, "tensor", 0, MAX_INDEX, &t) &&
		    int3_array(sr, "imap", MO_PHI, MO_MAX_RANK - 1, m) &&
		    req_i(sr, "fmap", MO_PHI, MO_MAX_RANK - 1, &u))
			mo_bg_iter(mg, bg, t, m[0], m[1], m[2], u);
	} else if (!strcmp(k, "op") || !strcmp(k, "kernel")) {
		const char *opname;
		struct mo_op_params p;
		int lo, hi, in[3];
		if (!req_str(sr, "op", &opname))
			return;
		enum mo_op op = mo_op_lookup(NULL, opname);
		arity(op, &lo, &hi);
		if (hi == 0)
			return (void)bad(sr, "op", "is not an op a μGraph holds");
		if (!int_array(sr, "in", true, lo, hi, 0, MAX_INDEX, dims, &n) ||
		    !read_params(sr, op, &p, sizes))
			return;
		for (int j = 0; j < n; j++)
			in[j] = (int)dims[j];
		if (k[0] == 'o')
			mo_bg_op(mg, bg, op, n, in, &p);
		else
			mo_mg_kernel(mg, op, n, in, &p);
	} else if (!strcmp(k, "const")) {
		double v;
		bool has;
		const struct jv *word = get(sr->s, "value"); /* an infinity, as written */
		if (word && word->t == J_STR && !strcmp(word->str, "-inf"))
			v = -INFINITY, has = true;
		else if (word && word->t == J_STR && !strcmp(word->str, "inf"))
			v = INFINITY, has = true;
		else if (!opt_real(sr, "value", 1e300, &v, &has))
			return;
		if (!has)
			return (void)bad(sr, "value", "is missing");
		mo_bg_const(mg, bg, v);
	} else if (!strcmp(k, "accum")) {
		const char *kind;
		int ak = -1;
		if (!req_i(sr, "tile", 0, MAX_INDEX, &t) || !req_str(sr, "kind", &kind))
			return;
		for (int j = 0; j <= MO_ACC_RESCALED; j++)
			if (!strcmp(kind, accum_names[j]))
				ak = j;
		if (ak < 0)
			bad(sr, "kind", "is not an accumulator kind");
		else if (ak == MO_ACC_RESCALED && req_i(sr, "max", 0, MAX_INDEX, &u))
			mo_bg_accum_rescaled(mg, bg, t, u);
		else if (ak != MO_ACC_RESCALED && get(s, "max"))
			bad(sr, "max", "is only for a rescaled accumulator");
		else if (ak != MO_ACC_RESCALED)
			mo_bg_accum(mg, bg, t, (enum mo_accum_kind)ak);
	} else if (!strcmp(k, "thread")) {
		if (req_i(sr, "first", 0, MAX_INDEX, &t) && req_i(sr, "last", 0, MAX_INDEX, &u))
			mo_bg_thread_graph(mg, bg, t, u);
	} else if (!strcmp(k, "save")) {
		int64_t r[3] = { 0, 0, 0 };
		int nr;
		if (req_i(sr, "tile", 0, MAX_INDEX, &t) &&
		    int3_array(sr, "omap", MO_PHI, MO_MAX_RANK - 1, m) &&
		    int_array(sr, "range", false, 3, 3, 0, INT32_MAX, r, &nr))
			mo_bg_save_range(mg, bg, t, m, (struct mo_bg_range){ (int)r[0], (int)r[1],
									     (int)r[2] });
	} else {
		bad(sr, "step", "is not a step kind");
	}
}

enum mo_status mo_mg_from_json(const char *text, struct mo_mugraph **out, struct mo_diag *d)
{
	*out = NULL;
	struct mo_arena a;
	mo_arena_init(&a);
	struct reader r = { .s = text, .a = &a };
	struct jv root;
	enum mo_status st = MO_OK;
	if (!parse(&r, &root)) {
		st = mo_diag_set(d, MO_ERR_INPUT, "μGraph JSON: %s at byte %zu", r.err,
				 (size_t)(r.s - text));
		goto done;
	}
	ws(&r);
	if (*r.s) {
		st = mo_diag_set(d, MO_ERR_INPUT, "μGraph JSON: text after the end at byte %zu",
				 (size_t)(r.s - text));
		goto done;
	}
	const struct jv *steps = get(&root, "steps");
	if (!steps || steps->t != J_ARR) {
		st = mo_diag_set(d, MO_ERR_INPUT, "μGraph JSON: no \"steps\" array");
		goto done;
	}
	if (steps->n > MO_MG_MAX_STEPS) {
		st = mo_diag_set(d, MO_ERR_INPUT, "μGraph JSON: more than %d steps", MO_MG_MAX_STEPS);
		goto done;
	}
	struct mo_mugraph *mg = mo_mg_new();
	if (!mg) {
		st = mo_diag_nomem(d);
		goto done;
	}
	for (int i = 0; i < steps->n && !mg->error[0]; i++) {
		struct step_reader sr = { .s = &steps->items[i], .err = mg->error,
					  .err_len = sizeof mg->error, .i = i };
		read_step(mg, &sr);
	}
	if (!mg->error[0])
		check_order(mg);
	if (mg->error[0]) {
		st = mo_diag_set(d, MO_ERR_INPUT, "μGraph JSON: %s", mg->error);
		mo_mg_free(mg);
	} else {
		*out = mg;
	}
done:
	mo_arena_free(&a);
	return st;
}

/* ---- Graphviz ---- */

static const char *map_str(int d, char *buf)
{
	if (d == MO_PHI)
		return "φ";
	snprintf(buf, 8, "%d", d);
	return buf;
}

void mo_mg_print_dot(const struct mo_mugraph *mg, FILE *out)
{
	fputs("digraph mugraph {\n  rankdir=TB;\n  node [fontname=Helvetica];\n", out);
	const struct mo_tp *kg = &mg->kg;
	for (int t = 0; t < kg->n_tensors; t++) {
		const struct mo_tensor *x = &kg->tensors[t];
		char shape[120];
		mo_tensor_describe(x, shape, sizeof shape);
		fprintf(out, "  k%d [shape=ellipse, label=\"%s\\n%s\"];\n", t,
			x->kind == MO_T_INPUT || x->is_graph_output ? x->name : "", shape);
	}
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) {
			fprintf(out, "  op%d [shape=box, label=\"%s\"];\n", k,
				mo_op_table[op->op.kind].name);
			for (int i = 0; i < op->op.n_in; i++)
				fprintf(out, "  k%d -> op%d;\n", op->op.in[i], k);
			fprintf(out, "  op%d -> k%d;\n", k, op->op.out[0]);
			continue;
		}
		const struct mo_block_graph *bg = op->bg;
		fprintf(out, "  subgraph cluster_%d {\n    label=\"kernel %d: grid (%d,%d,%d), "
			"for-loop %d\";\n    style=filled; color=\"#e8eef7\";\n", k, k + 1,
			bg->grid[0], bg->grid[1], bg->grid[2], bg->forloop);
		for (int i = 0; i < bg->body.n_ops; i++)
			fprintf(out, "    b%d_%d [shape=box, label=\"%s\"];\n", k,
				bg->body.ops[i].out[0], mo_op_table[bg->body.ops[i].kind].name);
		for (int i = 0; i < bg->n_iters; i++) {
			char a[8], b[8], c[8], f[8];
			const struct mo_bg_iter *it = &bg->iters[i];
			fprintf(out, "    b%d_%d [shape=invhouse, label=\"iter\\nimap (%s,%s,%s)"
				" fmap %s\"];\n", k, it->tile, map_str(it->imap[0], a),
				map_str(it->imap[1], b), map_str(it->imap[2], c), map_str(it->fmap, f));
		}
		for (int i = 0; i < bg->body.n_tensors; i++)
			if (bg->body.tensors[i].kind == MO_T_CONST)
				fprintf(out, "    b%d_%d [shape=plain, label=\"%.6g\"];\n", k, i,
					bg->body.tensors[i].fvals[0]);
		for (int i = 0; i < bg->n_accums; i++)
			fprintf(out, "    b%d_%d [shape=doubleoctagon, label=\"accum %s\"];\n", k,
				bg->accums[i].out, accum_names[bg->accums[i].kind]);
		for (int g = 0; g < bg->n_tgs; g++) {
			fprintf(out, "    subgraph cluster_thread_%d_%d {\n      label=\"thread graph\"; "
				"style=dashed;\n", k, g);
			for (int i = bg->tgs[g].first; i <= bg->tgs[g].last; i++)
				fprintf(out, "      b%d_%d;\n", k, bg->body.ops[i].out[0]);
			fputs("    }\n", out);
		}
		for (int i = 0; i < bg->n_savers; i++) {
			char a[8], b[8], c[8];
			const struct mo_bg_saver *sv = &bg->savers[i];
			fprintf(out, "    s%d_%d [shape=house, label=\"save\\nomap (%s,%s,%s)",
				k, i, map_str(sv->omap[0], a), map_str(sv->omap[1], b),
				map_str(sv->omap[2], c));
			if (sv->range.hi)
				fprintf(out, "\\nblocks %c %d..%d", "xyz"[sv->range.dim],
					sv->range.lo, sv->range.hi - 1);
			fprintf(out, "\"];\n");
		}
		fputs("  }\n", out);
		for (int i = 0; i < bg->n_iters; i++)
			fprintf(out, "  k%d -> b%d_%d;\n", bg->iters[i].tensor, k, bg->iters[i].tile);
		for (int i = 0; i < bg->body.n_ops; i++)
			for (int j = 0; j < bg->body.ops[i].n_in; j++)
				fprintf(out, "  b%d_%d -> b%d_%d;\n", k, bg->body.ops[i].in[j], k,
					bg->body.ops[i].out[0]);
		for (int i = 0; i < bg->n_accums; i++) {
			fprintf(out, "  b%d_%d -> b%d_%d;\n", k, bg->accums[i].in, k, bg->accums[i].out);
			if (bg->accums[i].max_in >= 0)
				fprintf(out, "  b%d_%d -> b%d_%d [style=dashed];\n", k,
					bg->accums[i].max_in, k, bg->accums[i].out);
		}
		for (int i = 0; i < bg->n_savers; i++)
			fprintf(out, "  b%d_%d -> s%d_%d;\n  s%d_%d -> k%d;\n", k, bg->savers[i].tile, k,
				i, k, i, bg->savers[i].tensor);
	}
	fputs("}\n", out);
}
