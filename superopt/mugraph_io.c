/* μGraphs to and from JSON (the build steps), and to Graphviz. */
#include "mo_mugraph.h"

#include <ctype.h>
#include <inttypes.h>
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
	if (p->trans_a || p->trans_b)
		fprintf(out, ", \"trans_a\": %d, \"trans_b\": %d", p->trans_a, p->trans_b);
	if (s->op == MO_OP_GEMM)
		fprintf(out, ", \"alpha\": %.17g, \"beta\": %.17g", p->alpha, p->beta);
	if (p->epsilon != 0)
		fprintf(out, ", \"epsilon\": %.17g", p->epsilon);
	if (p->has_exponent)
		fprintf(out, ", \"exponent\": %.17g", p->exponent);
	if (p->to)
		fprintf(out, ", \"to\": %d", p->to);
	if (s->op == MO_OP_SLICE) {
		ints(out, "starts", p->starts, p->n_axes);
		ints(out, "ends", p->ends, p->n_axes);
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

static bool num(const struct jv *o, const char *key, double *out)
{
	const struct jv *v = get(o, key);
	if (!v || v->t != J_NUM)
		return false;
	*out = v->num;
	return true;
}

static int inum(const struct jv *o, const char *key, int dflt)
{
	double d;
	return num(o, key, &d) && d == floor(d) && fabs(d) < 1e9 ? (int)d : dflt;
}

/* An integer array of at most max entries; its length or -1. */
static int arr(const struct jv *o, const char *key, int64_t *out, int max)
{
	const struct jv *v = get(o, key);
	if (!v || v->t != J_ARR || v->n > max)
		return -1;
	for (int i = 0; i < v->n; i++) {
		if (v->items[i].t != J_NUM || v->items[i].num != floor(v->items[i].num))
			return -1;
		out[i] = (int64_t)v->items[i].num;
	}
	return v->n;
}

static bool arr3(const struct jv *o, const char *key, int *out)
{
	int64_t w[3];
	if (arr(o, key, w, 3) != 3)
		return false;
	for (int i = 0; i < 3; i++) {
		if (w[i] < -1 || w[i] > 1 << 20)
			return false;
		out[i] = (int)w[i];
	}
	return true;
}

static enum mo_op op_named(const char *name)
{
	for (int k = 0; k < MO_OP_OPAQUE; k++)
		if (!strcmp(mo_op_table[k].name, name))
			return (enum mo_op)k;
	return MO_OP_OPAQUE;
}

static bool read_params(const struct jv *o, struct mo_op_params *p, int64_t *sizes)
{
	memset(p, 0, sizeof *p);
	int n = arr(o, "axes", p->axes, MO_MAX_RANK);
	p->n_axes = n > 0 ? n : 0;
	p->keepdims = inum(o, "keepdims", 0);
	p->trans_a = inum(o, "trans_a", 0);
	p->trans_b = inum(o, "trans_b", 0);
	num(o, "alpha", &p->alpha);
	num(o, "beta", &p->beta);
	num(o, "epsilon", &p->epsilon);
	p->has_exponent = num(o, "exponent", &p->exponent);
	p->to = inum(o, "to", 0);
	if (get(o, "starts") && (arr(o, "starts", p->starts, MO_MAX_RANK) != p->n_axes ||
				 arr(o, "ends", p->ends, MO_MAX_RANK) != p->n_axes ||
				 arr(o, "steps", p->steps, MO_MAX_RANK) != p->n_axes))
		return false;
	n = arr(o, "sizes", sizes, MO_MAX_RANK);
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
	const struct jv *steps = get(&root, "steps");
	if (!steps || steps->t != J_ARR) {
		st = mo_diag_set(d, MO_ERR_INPUT, "μGraph JSON: no \"steps\" array");
		goto done;
	}
	struct mo_mugraph *mg = mo_mg_new();
	if (!mg) {
		st = mo_diag_nomem(d);
		goto done;
	}
	for (int i = 0; i < steps->n && !mg->error[0]; i++) {
		const struct jv *s = &steps->items[i];
		const struct jv *kind = get(s, "step");
		int b = inum(s, "block", -1);
		struct mo_block_graph *bg = b >= 0 && b < mg->n_blocks ? mg->blocks[b] : NULL;
		int64_t dims[MO_MAX_RANK], sizes[MO_MAX_RANK];
		int m[3], in[3];
		struct mo_op_params p;
		const char *k = kind && kind->t == J_STR ? kind->str : "";
		if (!strcmp(k, "input")) {
			const struct jv *name = get(s, "name");
			int rank = arr(s, "shape", dims, MO_MAX_RANK);
			if (!name || name->t != J_STR || rank < 0)
				snprintf(mg->error, sizeof mg->error, "step %d: bad input", i);
			else
				mo_mg_input(mg, name->str, inum(s, "dtype", 1), rank, dims);
		} else if (!strcmp(k, "output")) {
			const struct jv *name = get(s, "name");
			if (!name || name->t != J_STR)
				snprintf(mg->error, sizeof mg->error, "step %d: bad output", i);
			else
				mo_mg_output(mg, inum(s, "tensor", -1), name->str);
		} else if (!strcmp(k, "block")) {
			if (!arr3(s, "grid", m))
				snprintf(mg->error, sizeof mg->error, "step %d: bad grid", i);
			else
				mo_mg_block(mg, m[0], m[1], m[2], inum(s, "forloop", 0));
		} else if (!strcmp(k, "iter")) {
			if (!arr3(s, "imap", m))
				snprintf(mg->error, sizeof mg->error, "step %d: bad imap", i);
			else
				mo_bg_iter(mg, bg, inum(s, "tensor", -1), m[0], m[1], m[2],
					   inum(s, "fmap", MO_PHI));
		} else if (!strcmp(k, "op") || !strcmp(k, "kernel")) {
			const struct jv *op = get(s, "op");
			int n = arr(s, "in", dims, 3);
			enum mo_op kind_op = op && op->t == J_STR ? op_named(op->str) : MO_OP_OPAQUE;
			if (kind_op == MO_OP_OPAQUE || n < 1 || !read_params(s, &p, sizes)) {
				snprintf(mg->error, sizeof mg->error, "step %d: bad op", i);
				break;
			}
			for (int j = 0; j < n; j++)
				in[j] = (int)dims[j];
			if (k[0] == 'o')
				mo_bg_op(mg, bg, kind_op, n, in, &p);
			else
				mo_mg_kernel(mg, kind_op, n, in, &p);
		} else if (!strcmp(k, "const")) {
			double v;
			if (!num(s, "value", &v))
				snprintf(mg->error, sizeof mg->error, "step %d: bad const", i);
			else
				mo_bg_const(mg, bg, v);
		} else if (!strcmp(k, "accum")) {
			const struct jv *kind = get(s, "kind");
			int ak = -1;
			for (int j = 0; kind && kind->t == J_STR && j <= MO_ACC_RESCALED; j++)
				if (!strcmp(kind->str, accum_names[j]))
					ak = j;
			if (ak < 0)
				snprintf(mg->error, sizeof mg->error, "step %d: bad accumulator kind", i);
			else if (ak == MO_ACC_RESCALED)
				mo_bg_accum_rescaled(mg, bg, inum(s, "tile", -1), inum(s, "max", -1));
			else
				mo_bg_accum(mg, bg, inum(s, "tile", -1), (enum mo_accum_kind)ak);
		} else if (!strcmp(k, "thread")) {
			mo_bg_thread_graph(mg, bg, inum(s, "first", -1), inum(s, "last", -1));
		} else if (!strcmp(k, "save")) {
			if (!arr3(s, "omap", m))
				snprintf(mg->error, sizeof mg->error, "step %d: bad omap", i);
			else
				mo_bg_save(mg, bg, inum(s, "tile", -1), m[0], m[1], m[2]);
		} else {
			snprintf(mg->error, sizeof mg->error, "step %d: unknown step '%s'", i, k);
		}
	}
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
			fprintf(out, "    s%d_%d [shape=house, label=\"save\\nomap (%s,%s,%s)\"];\n",
				k, i, map_str(sv->omap[0], a), map_str(sv->omap[1], b),
				map_str(sv->omap[2], c));
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
