/* Symbolic dimensions as dim_param text: a recursive-descent reader that
 * evaluates, or lists the symbols of, sums, differences, products, floor
 * quotients and remainders of symbols and integers (mo_dimexpr.h). */
#include "mo_dimexpr.h"

#include <string.h>

struct reader {
	const char *s;
	size_t pos;
	int tokens;
	bool bad;     /* not an expression: the text is one opaque symbol */
	bool unbound; /* a symbol has no value */
	bool invalid; /* overflow, a negative value, a division by zero */
	mo_dim_lookup lookup;
	void *ctx;
	void (*each)(void *ctx, const char *name, size_t len);
};

static bool ident_start(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static bool ident_char(char c)
{
	return ident_start(c) || (c >= '0' && c <= '9') || c == '.';
}

static void skip_space(struct reader *r)
{
	while (r->s[r->pos] == ' ' || r->s[r->pos] == '\t')
		r->pos++;
}

/* Consumes the operator op if it comes next. */
static bool take(struct reader *r, const char *op)
{
	skip_space(r);
	size_t n = strlen(op);
	if (strncmp(r->s + r->pos, op, n) != 0)
		return false;
	/* '/' alone is not an operator: only the floor quotient '//' is */
	if (op[0] == '/' && n == 1)
		return false;
	r->pos += n;
	r->tokens++;
	return true;
}

static int64_t expr(struct reader *r);

static int64_t factor(struct reader *r)
{
	skip_space(r);
	const char *p = r->s + r->pos;
	if (*p == '(') {
		r->pos++;
		r->tokens++;
		int64_t v = expr(r);
		if (!take(r, ")"))
			r->bad = true;
		return v;
	}
	if (*p >= '0' && *p <= '9') {
		int64_t v = 0;
		while (r->s[r->pos] >= '0' && r->s[r->pos] <= '9') {
			if (__builtin_mul_overflow(v, 10, &v) ||
			    __builtin_add_overflow(v, r->s[r->pos] - '0', &v))
				r->invalid = true;
			r->pos++;
		}
		r->tokens++;
		return v;
	}
	if (ident_start(*p)) {
		size_t n = 0;
		while (ident_char(p[n]))
			n++;
		r->pos += n;
		r->tokens++;
		if (r->each)
			r->each(r->ctx, p, n);
		int64_t v = 0;
		if (!r->lookup || !r->lookup(r->ctx, p, n, &v))
			r->unbound = true;
		return v;
	}
	r->bad = true;
	return 0;
}

static int64_t term(struct reader *r)
{
	int64_t v = factor(r);
	for (;;) {
		int op = take(r, "*") ? '*' : take(r, "//") ? '/' : take(r, "%") ? '%' : 0;
		if (!op || r->bad)
			return v;
		int64_t w = factor(r);
		if (r->unbound || r->invalid || r->bad)
			continue;
		if (op == '*' ? __builtin_mul_overflow(v, w, &v) : w == 0)
			r->invalid = true;
		else if (op != '*')
			v = op == '/' ? v / w : v % w; /* both ≥ 0: floor */
	}
}

static int64_t expr(struct reader *r)
{
	int64_t v = term(r);
	for (;;) {
		int op = take(r, "+") ? '+' : take(r, "-") ? '-' : 0;
		if (!op || r->bad)
			return v;
		int64_t w = term(r);
		if (r->unbound || r->invalid || r->bad)
			continue;
		if (op == '+' ? __builtin_add_overflow(v, w, &v) : __builtin_sub_overflow(v, w, &v))
			r->invalid = true;
		else if (v < 0)
			r->invalid = true;
	}
}

/* Reads all of s; false when s is not an expression. */
static bool read_all(struct reader *r, int64_t *v)
{
	*v = expr(r);
	skip_space(r);
	return !r->bad && r->s[r->pos] == '\0';
}

bool mo_dimexpr_plain(const char *s)
{
	for (; *s; s++)
		if (!ident_char(*s))
			return false;
	return true;
}

bool mo_dimexpr_is_compound(const char *s)
{
	struct reader r = { .s = s };
	int64_t v;
	return read_all(&r, &v) && r.tokens > 1;
}

enum mo_dimexpr_result mo_dimexpr_eval(const char *s, mo_dim_lookup lookup, void *ctx,
				       int64_t *v)
{
	struct reader r = { .s = s, .lookup = lookup, .ctx = ctx };
	if (!read_all(&r, v))
		return lookup(ctx, s, strlen(s), v) ? (*v < 0 ? MO_DIMEXPR_INVALID : MO_DIMEXPR_VALUE)
						    : MO_DIMEXPR_UNBOUND;
	if (r.unbound)
		return MO_DIMEXPR_UNBOUND;
	return r.invalid || *v < 0 ? MO_DIMEXPR_INVALID : MO_DIMEXPR_VALUE;
}

void mo_dimexpr_symbols(const char *s, void (*each)(void *ctx, const char *name, size_t len),
			void *ctx)
{
	struct reader probe = { .s = s };
	int64_t v;
	if (!read_all(&probe, &v)) {
		each(ctx, s, strlen(s));
		return;
	}
	struct reader r = { .s = s, .each = each, .ctx = ctx };
	read_all(&r, &v);
}

/* lookup with `unknown` set to x */
struct trial {
	const char *unknown;
	size_t len;
	int64_t x;
	mo_dim_lookup lookup;
	void *ctx;
};

static bool trial_lookup(void *ctx, const char *name, size_t len, int64_t *v)
{
	struct trial *t = ctx;
	if (len == t->len && memcmp(name, t->unknown, len) == 0) {
		*v = t->x;
		return true;
	}
	return t->lookup(t->ctx, name, len, v);
}

static bool eval_at(const char *s, struct trial *t, int64_t x, int64_t *v)
{
	t->x = x;
	return mo_dimexpr_eval(s, trial_lookup, t, v) == MO_DIMEXPR_VALUE;
}

bool mo_dimexpr_solve(const char *s, const char *unknown, size_t len, mo_dim_lookup lookup,
		      void *ctx, int64_t target, int64_t *x)
{
	struct trial t = { unknown, len, 0, lookup, ctx };
	int64_t a, a1, a2, a7, v;
	/* affine in x: checked at four points (a product x·x, a quotient or a
	 * remainder by a constant is not affine at all of them) */
	if (!eval_at(s, &t, 0, &a) || !eval_at(s, &t, 1, &a1) || !eval_at(s, &t, 2, &a2) ||
	    !eval_at(s, &t, 7, &a7))
		return false;
	int64_t b = a1 - a;
	if (b <= 0 || a2 != a + 2 * b || a7 != a + 7 * b || target < a || (target - a) % b)
		return false;
	*x = (target - a) / b;
	return eval_at(s, &t, *x, &v) && v == target;
}
