/* Symbolic dimensions: collected from the graph's value infos, bound from
 * the command line, derived dims solved and checked (symbols.h). */
#include "symbols.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *str(const char *s) { return s ? s : ""; }

const Onnx__TensorShapeProto *mo_symtab_shape_of(const Onnx__ValueInfoProto *v)
{
	const Onnx__TypeProto *ty = v ? v->type : NULL;
	if (!ty || ty->value_case != ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE)
		return NULL;
	return ty->tensor_type->shape;
}

const char *mo_symtab_raw_param(const Onnx__TensorShapeProto__Dimension *dim)
{
	return dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM
		       ? str(dim->dim_param)
		       : "";
}

const char *mo_symtab_param(const struct mo_symtab *st, const char *raw)
{
	const struct mo_import_options *o = st->opt;
	for (int i = 0; o && i < o->n_readings && i < MO_IMPORT_MAX_READINGS; i++)
		if (o->reading_of[i] && o->read_as[i] && strcmp(raw, o->reading_of[i]) == 0)
			return o->read_as[i];
	return raw;
}

/* A dim's dim_param as read (mo_symtab_param), "" for a value. */
static const char *param_of(const struct mo_symtab *st,
			    const Onnx__TensorShapeProto__Dimension *dim)
{
	return mo_symtab_param(st, mo_symtab_raw_param(dim));
}

/* The symbol named name[0..len), or -1. */
static int find_sym(struct mo_symtab *st, const char *name, size_t len)
{
	char small[128];
	char *key = len < sizeof small ? small : mo_malloc(len + 1);
	if (!key)
		return -1;
	memcpy(key, name, len);
	key[len] = '\0';
	const int *p = mo_strmap_get(&st->index, key);
	if (key != small)
		mo_free(key);
	return p ? *p : -1;
}

/* The symbol name[0..len), added unbound if new; -1 when out of memory. */
static int add_sym(struct mo_symtab *st, const char *name, size_t len)
{
	int k = find_sym(st, name, len);
	if (k >= 0)
		return k;
	struct mo_tp *tp = st->tp;
	if (tp->n_syms == st->cap) {
		int cap = st->cap ? st->cap * 2 : 16;
		struct mo_tp_sym *s = mo_arena_array(&tp->arena, (size_t)cap, sizeof *s);
		if (!s)
			return -1;
		if (tp->n_syms)
			memcpy(s, tp->syms, (size_t)tp->n_syms * sizeof *s);
		tp->syms = s;
		st->cap = cap;
	}
	char *copy = mo_arena_alloc(&tp->arena, len + 1);
	if (!copy)
		return -1;
	memcpy(copy, name, len);
	copy[len] = '\0';
	k = tp->n_syms;
	int had;
	if (!mo_strmap_put(&st->index, copy, k, &had))
		return -1;
	tp->syms[tp->n_syms++] = (struct mo_tp_sym){ .name = copy };
	return k;
}

struct collect {
	struct mo_symtab *st;
	const char *input; /* the graph input whose dims are read, or NULL */
	bool failed;
};

static void collect_one(void *ctx, const char *name, size_t len)
{
	struct collect *c = ctx;
	int k = add_sym(c->st, name, len);
	if (k < 0) {
		c->failed = true;
		return;
	}
	struct mo_tp_sym *s = &c->st->tp->syms[k];
	if (!c->input)
		return;
	s->in_input = true;
	/* each input once, the first four by name */
	const char *l = s->inputs;
	size_t n = strlen(c->input);
	for (const char *p = l; p && (p = strstr(p, c->input)); p += n)
		if ((p == l || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
			return;
	int items = 1;
	for (const char *p = l; p && *p; p++)
		items += *p == ',';
	if (l && (items > 4 || strstr(l, ", ...")))
		return;
	s->inputs = !l ? mo_arena_strdup(&c->st->tp->arena, c->input)
		       : items == 4 ? mo_arena_printf(&c->st->tp->arena, "%s, ...", l)
				    : mo_arena_printf(&c->st->tp->arena, "%s, %s", l, c->input);
	c->failed |= !s->inputs;
}

static bool collect_value(struct mo_symtab *st, const Onnx__ValueInfoProto *v, bool input)
{
	const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(v);
	struct collect c = { st, input ? str(v->name) : NULL, false };
	for (size_t i = 0; sh && i < sh->n_dim; i++)
		if (*param_of(st, sh->dim[i]))
			mo_dimexpr_symbols(param_of(st, sh->dim[i]), collect_one, &c);
	return !c.failed;
}

static bool sym_lookup(void *ctx, const char *name, size_t len, int64_t *v)
{
	struct mo_symtab *st = ctx;
	int k = find_sym(st, name, len);
	if (k < 0 || !st->tp->syms[k].bound || st->tp->syms[k].whole_text)
		return false;
	*v = st->tp->syms[k].value;
	return true;
}

/* The value of a derived dim by its symbols alone (not by its whole text). */
static enum mo_dimexpr_result eval_symbols(struct mo_symtab *st, const char *param, int64_t *v)
{
	if (!mo_dimexpr_is_compound(param))
		return sym_lookup(st, param, strlen(param), v) ? MO_DIMEXPR_VALUE
							     : MO_DIMEXPR_UNBOUND;
	return mo_dimexpr_eval(param, sym_lookup, st, v);
}

enum mo_dimexpr_result mo_symtab_dim(struct mo_symtab *st, const char *param, int64_t *v)
{
	enum mo_dimexpr_result r = eval_symbols(st, param, v);
	if (r != MO_DIMEXPR_UNBOUND)
		return r;
	int k = find_sym(st, param, strlen(param));
	if (k >= 0 && st->tp->syms[k].bound) {
		*v = st->tp->syms[k].value;
		return MO_DIMEXPR_VALUE;
	}
	return MO_DIMEXPR_UNBOUND;
}

/* The symbol names the model's inputs use, for an error: "a, b, c". */
static const char *known_names(struct mo_symtab *st)
{
	static char buf[300];
	size_t n = 0;
	buf[0] = '\0';
	for (int i = 0; i < st->tp->n_syms && n < sizeof buf - 40; i++) {
		const struct mo_tp_sym *s = &st->tp->syms[i];
		if (s->in_input && !s->whole_text)
			n += (size_t)snprintf(buf + n, sizeof buf - n, "%s%.60s", n ? ", " : "",
					      s->name);
	}
	if (!n)
		snprintf(buf, sizeof buf, "none");
	return buf;
}

static enum mo_status bind(struct mo_symtab *st, int k, int64_t v, const char *how,
			   struct mo_diag *d)
{
	struct mo_tp_sym *s = &st->tp->syms[k];
	if (s->bound && s->value != v)
		return mo_diag_set(d, MO_ERR_USAGE,
				   "'%.100s' is %" PRId64 " by %.100s but %" PRId64 " by %.100s",
				   s->name, s->value, s->how, v, how);
	if (s->bound)
		return MO_OK;
	s->bound = true;
	s->value = v;
	s->how = mo_arena_strdup(&st->tp->arena, how);
	return s->how ? MO_OK : mo_diag_nomem(d);
}

/* Whether some dim of vs[0..n) is exactly name. */
static bool alone_in(Onnx__ValueInfoProto *const *vs, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++) {
		const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(vs[i]);
		for (size_t k = 0; sh && k < sh->n_dim; k++)
			if (strcmp(mo_symtab_raw_param(sh->dim[k]), name) == 0)
				return true;
	}
	return false;
}

/* Whether text is a whole dim_param somewhere in the graph's value infos. */
static bool is_dim_param(const Onnx__GraphProto *g, const char *text)
{
	return alone_in(g->input, g->n_input, text) || alone_in(g->output, g->n_output, text) ||
	       alone_in(g->value_info, g->n_value_info, text);
}

struct unknowns {
	struct mo_symtab *st;
	int first, n; /* the first unbound symbol, how many distinct ones */
};

static void count_unbound(void *ctx, const char *name, size_t len)
{
	struct unknowns *u = ctx;
	int64_t v;
	int k = find_sym(u->st, name, len);
	if (k < 0 || k == u->first || sym_lookup(u->st, name, len, &v))
		return;
	if (u->first < 0)
		u->first = k;
	u->n++;
}

/* A derived dim_param whose value is known (by --dim of its text, or an
 * --input-shape): the one symbol of it left unbound is solved for; with
 * every symbol bound it must agree. Sets *progress when it bound one. */
static enum mo_status settle(struct mo_symtab *st, const char *param, int64_t value,
			     const char *how, bool *progress, struct mo_diag *d)
{
	int64_t v;
	enum mo_dimexpr_result r = eval_symbols(st, param, &v);
	if (r == MO_DIMEXPR_VALUE) {
		if (v == value)
			return MO_OK;
		char vals[200] = "";
		size_t n = 0;
		for (int i = 0; i < st->tp->n_syms && n < sizeof vals - 40; i++) {
			const struct mo_tp_sym *s = &st->tp->syms[i];
			if (s->bound && !s->whole_text && strstr(param, s->name))
				n += (size_t)snprintf(vals + n, sizeof vals - n, "%s%.40s=%" PRId64,
						      n ? ", " : "", s->name, s->value);
		}
		return mo_diag_set(d, MO_ERR_USAGE,
				   "'%.100s' is %" PRId64 " by %.100s, but %" PRId64 " from %s",
				   param, value, how, v, vals);
	}
	if (r == MO_DIMEXPR_INVALID)
		return mo_diag_set(d, MO_ERR_USAGE, "'%.100s' has no valid value with these bindings",
				   param);
	/* the symbols still unbound: solvable when there is exactly one */
	struct unknowns u = { st, -1, 0 };
	mo_dimexpr_symbols(param, count_unbound, &u);
	int unknown = u.first, n_unknown = u.n;
	if (n_unknown != 1)
		return MO_OK; /* the dim keeps the value by its text alone */
	const struct mo_tp_sym *s = &st->tp->syms[unknown];
	int64_t x;
	if (!mo_dimexpr_solve(param, s->name, strlen(s->name), sym_lookup, st, value, &x))
		return mo_diag_set(d, MO_ERR_USAGE,
				   "'%.100s' = %" PRId64 " (%.100s) gives no whole %.100s >= 0",
				   param, value, how, s->name);
	char why[300];
	snprintf(why, sizeof why, "'%.100s' = %" PRId64 " (%.100s)", param, value, how);
	*progress = true;
	return bind(st, unknown, x, why, d);
}

/* --input-shape NAME=...: its dims against the declared ones, the symbols
 * of the declared ones bound. Derived dims are settled later (*derived
 * collects them as pairs of indices: option, axis). */
static enum mo_status bind_input_shape(struct mo_symtab *st, const Onnx__GraphProto *g,
				       const struct mo_import_options *o, int k,
				       struct mo_diag *d)
{
	const char *name = o->input_shape_names[k];
	const Onnx__ValueInfoProto *v = NULL;
	for (size_t i = 0; i < g->n_input && !v; i++)
		if (strcmp(str(g->input[i]->name), name) == 0)
			v = g->input[i];
	const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(v);
	if (!sh)
		return MO_OK; /* unknown or missing: the importer says which */
	int rank = o->input_shape_ranks[k];
	if ((int)sh->n_dim != rank)
		return mo_diag_set(d, MO_ERR_USAGE,
				   "--input-shape %.100s: the model declares %zu dims, not %d",
				   name, sh->n_dim, rank);
	char how[160];
	snprintf(how, sizeof how, "--input-shape %.100s", name);
	for (int i = 0; i < rank; i++) {
		const Onnx__TensorShapeProto__Dimension *dim = sh->dim[i];
		int64_t given = o->input_shape_dims[k][i];
		if (dim->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE &&
		    dim->dim_value > 0 && dim->dim_value != given)
			return mo_diag_set(d, MO_ERR_USAGE,
					   "--input-shape %.100s: dim %d is %" PRId64
					   " in the model, not %" PRId64,
					   name, i, dim->dim_value, given);
		const char *param = param_of(st, dim);
		if (*param && !mo_dimexpr_is_compound(param)) {
			int s = find_sym(st, param, strlen(param));
			if (s >= 0 && bind(st, s, given, how, d))
				return d->status;
		}
	}
	return MO_OK;
}

/* Derived dims given a value (by --dim of their text or an --input-shape)
 * settled until none binds a further symbol. */
static enum mo_status settle_all(struct mo_symtab *st, const Onnx__GraphProto *g,
				 const struct mo_import_options *o, struct mo_diag *d)
{
	bool progress = true;
	for (int round = 0; progress && round <= st->tp->n_syms; round++) {
		progress = false;
		for (int i = 0; i < st->tp->n_syms; i++) {
			const struct mo_tp_sym *s = &st->tp->syms[i];
			if (s->whole_text && settle(st, s->name, s->value, s->how, &progress, d))
				return d->status;
		}
		for (int k = 0; k < o->n_input_shapes; k++) {
			const Onnx__ValueInfoProto *v = NULL;
			for (size_t i = 0; i < g->n_input && !v; i++)
				if (strcmp(str(g->input[i]->name), o->input_shape_names[k]) == 0)
					v = g->input[i];
			const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(v);
			char how[160];
			snprintf(how, sizeof how, "--input-shape %.100s", o->input_shape_names[k]);
			for (int a = 0; sh && a < (int)sh->n_dim && a < o->input_shape_ranks[k]; a++) {
				const char *param = param_of(st, sh->dim[a]);
				if (mo_dimexpr_is_compound(param) &&
				    settle(st, param, o->input_shape_dims[k][a], how, &progress, d))
					return d->status;
			}
		}
	}
	return MO_OK;
}

struct pair {
	struct mo_symtab *st;
	int k[2], n; /* a dim's first two distinct symbols; n: more than 2 when it has more */
};

static void pair_one(void *ctx, const char *name, size_t len)
{
	struct pair *p = ctx;
	int k = find_sym(p->st, name, len);
	if (k < 0 || (p->n > 0 && p->k[0] == k) || (p->n > 1 && p->k[1] == k))
		return;
	if (p->n < 2)
		p->k[p->n] = k;
	p->n++;
}

/* Marks the new-token symbol of a KV cache: of the two symbols of a graph
 * input's or output's derived dim (the attention mask's and the present
 * keys' past + sequence), the one an output's dims hold alone (the
 * logits' sequence) while the other is alone in an input's (the past
 * keys') and in no output's. */
static void mark_new_tokens(struct mo_symtab *st, const Onnx__GraphProto *g)
{
	Onnx__ValueInfoProto *const *lists[2] = { g->input, g->output };
	size_t counts[2] = { g->n_input, g->n_output };
	for (int l = 0; l < 2; l++)
		for (size_t i = 0; i < counts[l]; i++) {
			const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(lists[l][i]);
			for (size_t x = 0; sh && x < sh->n_dim; x++) {
				const char *param = param_of(st, sh->dim[x]);
				struct pair p = { st, { -1, -1 }, 0 };
				if (!mo_dimexpr_is_compound(param))
					continue;
				mo_dimexpr_symbols(param, pair_one, &p);
				for (int a = 0; p.n == 2 && a < 2; a++) {
					struct mo_tp_sym *s = &st->tp->syms[p.k[a]];
					const char *other = st->tp->syms[p.k[1 - a]].name;
					if (alone_in(g->output, g->n_output, s->name) &&
					    alone_in(g->input, g->n_input, other) &&
					    !alone_in(g->output, g->n_output, other))
						s->past = other;
				}
			}
		}
}

enum mo_status mo_symtab_bind(struct mo_symtab *st, const Onnx__GraphProto *g,
			      const struct mo_import_options *o, struct mo_diag *d)
{
	st->opt = o;
	for (size_t i = 0; i < g->n_input; i++)
		if (!collect_value(st, g->input[i], true))
			return mo_diag_nomem(d);
	for (size_t i = 0; i < g->n_output; i++)
		if (!collect_value(st, g->output[i], false))
			return mo_diag_nomem(d);
	for (size_t i = 0; i < g->n_value_info; i++)
		if (!collect_value(st, g->value_info[i], false))
			return mo_diag_nomem(d);
	mark_new_tokens(st, g);
	if (!o)
		return MO_OK;
	for (int i = 0; i < o->n_dims; i++) {
		const char *name = o->dim_names[i];
		int k = find_sym(st, name, strlen(name));
		if (k < 0 && mo_dimexpr_is_compound(name) && is_dim_param(g, name)) {
			k = add_sym(st, name, strlen(name));
			if (k < 0)
				return mo_diag_nomem(d);
			st->tp->syms[k].whole_text = true;
		}
		if (k < 0)
			return mo_diag_set(d, MO_ERR_USAGE,
					   "--dim %.100s: the model has no symbolic dimension "
					   "'%.100s' (its inputs have: %s)",
					   name, name, known_names(st));
		if (bind(st, k, o->dim_values[i], "--dim", d))
			return d->status;
	}
	for (int k = 0; k < o->n_input_shapes; k++)
		if (bind_input_shape(st, g, o, k, d))
			return d->status;
	if (settle_all(st, g, o, d))
		return d->status;
	/* a range names a symbol of the inputs; a value it has (bound by
	 * another flag, or derived) lies within it */
	for (int i = 0; i < o->n_ranges; i++) {
		const char *name = o->range_names[i];
		int64_t lo = o->ranges[i][0], hi = o->ranges[i][1];
		int k = find_sym(st, name, strlen(name));
		if (k < 0 || st->tp->syms[k].whole_text)
			return mo_diag_set(d, MO_ERR_USAGE,
					   "--dim %.100s=%" PRId64 "..%" PRId64 ": the model has no "
					   "symbolic dimension '%.100s' (a range bounds one of: %s)",
					   name, lo, hi, name, known_names(st));
		const struct mo_tp_sym *s = &st->tp->syms[k];
		if (s->bound && (s->value < lo || s->value > hi))
			return mo_diag_set(d, MO_ERR_USAGE,
					   "'%.100s' is %" PRId64 " by %.100s, outside its range %" PRId64
					   "..%" PRId64 " (--dim)", name, s->value, s->how, lo, hi);
	}
	return MO_OK;
}

/* name with each ' written '\'' (inside single quotes) */
static const char *shell_escaped(struct mo_arena *a, const char *name)
{
	size_t n = 0;
	for (const char *c = name; *c; c++)
		n += *c == '\'' ? 4 : 1;
	char *q = mo_arena_alloc(a, n + 1), *o = q;
	if (!q)
		return "";
	for (const char *c = name; *c; c++)
		if (*c == '\'') {
			memcpy(o, "'\\''", 4);
			o += 4;
		} else {
			*o++ = *c;
		}
	*o = '\0';
	return q;
}

struct needed {
	struct mo_symtab *st;
	bool *need;
};

static void mark_unbound(void *ctx, const char *name, size_t len)
{
	struct needed *n = ctx;
	int64_t v;
	int k = find_sym(n->st, name, len);
	if (k >= 0 && !sym_lookup(n->st, name, len, &v))
		n->need[k] = true;
}

const char *mo_symtab_unbound(struct mo_symtab *st, const Onnx__GraphProto *g,
			      const struct mo_import_options *o)
{
	struct mo_tp *tp = st->tp;
	bool *need = mo_arena_array(&tp->arena, (size_t)tp->n_syms + 1, sizeof *need);
	if (!need)
		return NULL;
	struct needed n = { st, need };
	for (size_t i = 0; i < g->n_input; i++) {
		bool overridden = false;
		for (int k = 0; o && k < o->n_input_shapes; k++)
			overridden |= strcmp(o->input_shape_names[k], str(g->input[i]->name)) == 0;
		const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(g->input[i]);
		for (size_t k = 0; sh && !overridden && k < sh->n_dim; k++) {
			const char *param = param_of(st, sh->dim[k]);
			int64_t v;
			if (*param && mo_symtab_dim(st, param, &v) == MO_DIMEXPR_UNBOUND)
				mo_dimexpr_symbols(param, mark_unbound, &n);
		}
	}
	const char *list = NULL, *flags = "";
	for (int i = 0; i < tp->n_syms; i++) {
		if (!need[i])
			continue;
		const struct mo_tp_sym *s = &tp->syms[i];
		list = list ? mo_arena_printf(&tp->arena, "%s, %s (%s)", list, s->name, str(s->inputs))
			    : mo_arena_printf(&tp->arena, "%s (%s)", s->name, str(s->inputs));
		/* the flag as a shell reads it: a name with other characters quoted */
		flags = mo_dimexpr_plain(s->name) ? mo_arena_printf(&tp->arena, "%s --dim %s=N", flags, s->name)
			      : mo_arena_printf(&tp->arena, "%s --dim '%s=N'", flags,
						shell_escaped(&tp->arena, s->name));
		if (!list || !flags)
			return NULL;
	}
	return list ? mo_arena_printf(&tp->arena, "%s; bind %s with%s", list,
				      strchr(list, ',') ? "them" : "it", flags) : NULL;
}

void mo_symtab_free(struct mo_symtab *st)
{
	mo_strmap_free(&st->index);
}
