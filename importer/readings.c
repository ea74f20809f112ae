/* Derived dims the graph contradicts, read as the graph needs them
 * (mo_import.h, mo_import_readings).
 *
 * Optimum 1.x names the attention mask's and the present keys' second-to-
 * last dim of a decoder with past "past_sequence_length + 1": true of a
 * decode step only. The graph adds the mask to scores over the past and the
 * new keys, so at a prompt of several tokens it is past + sequence. Read as
 * written, every shape after that Add is unknown at the sizes the fuse
 * searches at, and nothing after layer 0's attention fuses. A dim_param
 * S + c (one symbol, a constant added) of a graph input is therefore tried
 * as S + T for each other symbol T of the inputs: the model is imported at
 * distinct sizes of its symbols each way, and the reading that leaves the
 * fewest tensors of unknown shape is kept when it leaves fewer than the
 * text. Where T is c (a decode step) the two agree, so the reading only
 * widens what the text says; ONNX Runtime does not check dim_params, and
 * the fused ops check the dims they read against each other. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "mo_dimexpr.h"
#include "mo_import.h"
#include "symbols.h"

#define MAX_SYMS 16

struct names {
	const char *at[MAX_SYMS];
	size_t len[MAX_SYMS];
	int n;
	bool more; /* past MAX_SYMS */
};

static void add_name(void *ctx, const char *name, size_t len)
{
	struct names *s = ctx;
	for (int i = 0; i < s->n; i++)
		if (s->len[i] == len && !memcmp(s->at[i], name, len))
			return;
	if (s->n == MAX_SYMS) {
		s->more = true;
		return;
	}
	s->at[s->n] = name;
	s->len[s->n++] = len;
}

static bool zero(void *ctx, const char *name, size_t len, int64_t *v)
{
	(void)ctx, (void)name, (void)len;
	*v = 0;
	return true;
}

static bool one(void *ctx, const char *name, size_t len, int64_t *v)
{
	(void)ctx, (void)name, (void)len;
	*v = 1;
	return true;
}

/* Whether text is S + c: one symbol (*sym), slope 1, a constant c > 0. */
static bool symbol_plus_constant(const char *text, struct names *sym)
{
	int64_t at0, at1;
	sym->n = 0;
	if (!mo_dimexpr_is_compound(text))
		return false;
	mo_dimexpr_symbols(text, add_name, sym);
	return sym->n == 1 && mo_dimexpr_eval(text, zero, NULL, &at0) == MO_DIMEXPR_VALUE &&
	       mo_dimexpr_eval(text, one, NULL, &at1) == MO_DIMEXPR_VALUE && at0 > 0 &&
	       at1 == at0 + 1;
}

/* Whether --dim binds text (a derived dim bound by its whole text: then
 * it is not read otherwise). */
static bool bound_by_dim(const struct mo_import_options *o, const char *text)
{
	for (int i = 0; o && i < o->n_dims; i++)
		if (strcmp(o->dim_names[i], text) == 0)
			return true;
	return false;
}

/* The tensors an import of m under o (with the symbols' test sizes)
 * computes without a shape; -1 when it does not import (-2 out of memory). */
static long unknown_shapes(const struct mo_model *m, const struct mo_import_options *o)
{
	struct mo_tp *tp = NULL;
	struct mo_diag d;
	mo_diag_init(&d);
	if (mo_tp_import(m, o, &tp, &d))
		return d.status == MO_ERR_NOMEM ? -2 : -1;
	long n = 0;
	for (int t = 0; t < tp->n_tensors; t++)
		n += tp->tensors[t].kind == MO_T_VALUE && !tp->tensors[t].shape_known;
	mo_tp_free(tp);
	return n;
}

enum mo_status mo_import_readings(const struct mo_model *m, const struct mo_import_options *o,
				  struct mo_import_readings *r, struct mo_diag *d)
{
	memset(r, 0, sizeof *r);
	const Onnx__GraphProto *g = mo_onnx_proto(m)->graph;
	/* the plain symbols of the inputs (the candidates and what gets a
	 * test size), and the texts S + c */
	struct names plain = { 0 };
	const char *texts[MO_IMPORT_MAX_READINGS];
	int n_texts = 0;
	for (size_t i = 0; g && i < g->n_input; i++) {
		const Onnx__TensorShapeProto *sh = mo_symtab_shape_of(g->input[i]);
		for (size_t k = 0; sh && k < sh->n_dim; k++) {
			const char *p = mo_symtab_raw_param(sh->dim[k]);
			struct names sym;
			if (*p && !mo_dimexpr_is_compound(p) && mo_dimexpr_plain(p))
				add_name(&plain, p, strlen(p));
			else if (strlen(p) < sizeof r->reading_of[0] && symbol_plus_constant(p, &sym) &&
				 !bound_by_dim(o, p) && n_texts < MO_IMPORT_MAX_READINGS) {
				bool again = false;
				for (int j = 0; j < n_texts; j++)
					again |= !strcmp(texts[j], p);
				if (!again)
					texts[n_texts++] = p;
			}
		}
	}
	if (n_texts == 0 || plain.more)
		return MO_OK;
	/* distinct test sizes, so that no S + T equals S + c by chance: 3, 5,
	 * 7, ... for every symbol, whatever --dim and --input-shape say (the
	 * reading is the graph's, not the sizes'; at --dim sizes where S + c
	 * holds by broadcasting, a mask of 1 column, the fused ops would be
	 * made for inputs the model is never given) */
	static const int64_t sizes[MAX_SYMS] = { 3, 5, 7, 11, 13, 17, 19, 23,
						 29, 31, 37, 41, 43, 47, 53, 59 };
	struct mo_import_options t = { 0 };
	const char *names[MAX_SYMS];
	int64_t vals[MAX_SYMS];
	char name_buf[MAX_SYMS][128];
	int n = 0;
	for (int s = 0; s < plain.n; s++) {
		if (plain.len[s] >= sizeof name_buf[s])
			return MO_OK;
		snprintf(name_buf[s], sizeof name_buf[s], "%.*s", (int)plain.len[s], plain.at[s]);
		names[n] = name_buf[s];
		vals[n++] = sizes[s];
	}
	t.n_dims = n;
	t.dim_names = names;
	t.dim_values = vals;
	t.sizes_chosen = true;
	for (int x = 0; x < n_texts; x++) {
		long best = unknown_shapes(m, &t);
		if (best == -2)
			return mo_diag_nomem(d);
		if (best <= 0)
			break; /* every shape known as written (or it does not import) */
		struct names sym;
		symbol_plus_constant(texts[x], &sym);
		int k = r->n;
		t.reading_of[k] = texts[x];
		t.n_readings = k + 1;
		int chosen = -1;
		for (int c = 0; c < plain.n; c++) {
			if (plain.len[c] == sym.len[0] && !memcmp(plain.at[c], sym.at[0], sym.len[0]))
				continue;
			char as[sizeof r->read_as[0]];
			if (snprintf(as, sizeof as, "%.*s + %.*s", (int)sym.len[0], sym.at[0],
				     (int)plain.len[c], plain.at[c]) >= (int)sizeof as)
				continue;
			t.read_as[k] = as;
			long u = unknown_shapes(m, &t);
			if (u == -2)
				return mo_diag_nomem(d);
			if (u >= 0 && u < best) {
				best = u;
				chosen = c;
				snprintf(r->read_as[k], sizeof r->read_as[k], "%s", as);
			}
		}
		if (chosen < 0) {
			t.n_readings = k;
			continue;
		}
		snprintf(r->reading_of[k], sizeof r->reading_of[k], "%s", texts[x]);
		t.reading_of[k] = r->reading_of[k];
		t.read_as[k] = r->read_as[k];
		r->n = k + 1;
		int64_t c0 = 0;
		mo_dimexpr_eval(texts[x], zero, NULL, &c0);
		size_t at = strlen(r->said);
		snprintf(r->said + at, sizeof r->said - at,
			 "%sthe inputs' dim '%.100s' read as '%.100s' (the graph's shapes need it so; "
			 "as written it holds where %.*s is %" PRId64 " only)",
			 at ? "; " : "", texts[x], r->read_as[k], (int)plain.len[chosen],
			 plain.at[chosen], c0);
	}
	return MO_OK;
}
