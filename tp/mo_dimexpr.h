/* mo_dimexpr: a symbolic dimension as ONNX writes it in a dim_param.
 *
 * A dim_param is a symbol ("batch_size", "s0") or, as Optimum and torch write
 * for derived dimensions, an expression over symbols and integers with + - *
 * and parentheses ("past_sequence_length + sequence_length", "2*s1").
 * A dim_param that is not such an expression ("unk__3", "?" or anything
 * with other characters) is one opaque symbol: its whole text. Nothing here
 * allocates; expressions are read from the text each time (they are short). */
#ifndef MO_DIMEXPR_H
#define MO_DIMEXPR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The value of a symbol (name, len bytes, not NUL-terminated): true with *v
 * when bound. */
typedef bool (*mo_dim_lookup)(void *ctx, const char *name, size_t len, int64_t *v);

/* Whether s is an expression over symbols (more than one token); false for
 * a single symbol and for text that does not parse (an opaque symbol). */
bool mo_dimexpr_is_compound(const char *s);

/* Whether every character of s is one a symbol may hold (letters, digits,
 * '_', '.'): a name a shell or a report needs no quotes around. */
bool mo_dimexpr_plain(const char *s);

enum mo_dimexpr_result {
	MO_DIMEXPR_VALUE,    /* *v is its value */
	MO_DIMEXPR_UNBOUND,  /* a symbol in it has no value */
	MO_DIMEXPR_INVALID,  /* negative, or beyond int64 */
};

/* Evaluates s under lookup. A text that does not parse as an expression is
 * looked up whole. */
enum mo_dimexpr_result mo_dimexpr_eval(const char *s, mo_dim_lookup lookup, void *ctx,
				       int64_t *v);

/* Calls each(ctx, name, len) for every symbol of s, in order, repeats
 * included (the whole text when it does not parse). */
void mo_dimexpr_symbols(const char *s, void (*each)(void *ctx, const char *name, size_t len),
			void *ctx);

/* The value of the one unbound symbol `unknown` of s that makes s equal
 * target, where s is affine in it (a + b·x, b ≠ 0, every other symbol
 * bound): true with *x when that value is a whole number ≥ 0. */
bool mo_dimexpr_solve(const char *s, const char *unknown, size_t len, mo_dim_lookup lookup,
		      void *ctx, int64_t target, int64_t *x);

#endif
