/* mo_verify: proving programs equivalent (DESIGN §6, superopt/verify/
 * VERIFIER.md).
 *
 * Here: the finite-field arithmetic of the verifier, the float and
 * finite-field evaluators of tensor programs and of μGraphs, the verdict
 * that `mirage-onnx equiv` prints, and the search's fast check. */
#ifndef MO_VERIFY_H
#define MO_VERIFY_H

#include <stdint.h>

#include "mo_mugraph.h"

/* ---- the field ----
 * Values are pairs (x mod p, x mod q) with q prime near 2^31 and p = k·q + 1
 * prime below 2^62; ω has order q in Z_p, and exp(x) = ω^(x mod q) mod p. After
 * an exp the q half has no meaning (MO_FF_DEAD): a second exp on the same path
 * is outside Lax. */
#define MO_FF_DEAD UINT64_MAX

struct mo_ff {
	uint64_t p, q;
};

struct mo_field {
	uint64_t p, q, omega;
	uint64_t inv2_p, inv2_q; /* 1/2, for the dyadic constants */
};

/* The verifier's field (deterministic: the same on every run). */
const struct mo_field *mo_field_get(void);
uint64_t mo_ff_mulmod(uint64_t a, uint64_t b, uint64_t m);
uint64_t mo_ff_powmod(uint64_t a, uint64_t e, uint64_t m);
/* ω^x mod p for x < q, by table. */
uint64_t mo_ff_exp(const struct mo_field *f, uint64_t x);
/* Deterministic Miller-Rabin, exact for every 64-bit n. */
bool mo_is_prime_u64(uint64_t n);
/* The exact field value of a finite double (a dyadic rational m·2^e). */
bool mo_ff_from_double(const struct mo_field *f, double v, struct mo_ff *out);

/* ---- evaluation ---- */

enum mo_eval_domain { MO_EVAL_FLOAT, MO_EVAL_FF };

/* What an evaluation of a program gives: the values of its graph outputs, in
 * tp->outputs order (doubles for MO_EVAL_FLOAT, struct mo_ff for MO_EVAL_FF). */
struct mo_eval_result {
	enum mo_eval_domain domain;
	int n_outputs;
	const char **names; /* of the outputs */
	void **values;
	uint64_t *counts;
	bool div_by_zero; /* a finite-field division by zero: the trial says nothing */
	/* a view of results kept elsewhere (a memo's): mo_eval_result_free
	 * only forgets it */
	bool borrowed;
};

/* Evaluates every op of tp on random inputs drawn from a hash of (input name,
 * element index, seed), so two programs with the same input names see the
 * same inputs. Weights are read exactly. Ops outside the Lax fragment that
 * the verifier models (Sqrt, Relu, Erf, Tanh, ReduceMax, ...) are fixed
 * random functions of their operands (seeded), the same in both programs.
 * Fails with MO_ERR_INPUT naming the op it cannot evaluate. */
enum mo_status mo_eval(const struct mo_tp *tp, enum mo_eval_domain domain, uint64_t seed,
		       struct mo_eval_result *out, struct mo_diag *d);
/* The float value input `name` has at element `index` under `seed` (before
 * scaling): what mo_eval feeds a program, for tools that feed the same
 * values to another runtime. */
double mo_eval_float_input(const char *name, uint64_t index, uint64_t seed);
/* That value scaled, as an input of dtype holds it: rounded to a float
 * dtype; for a bool, 1 where it is ≥ 0, else 0 (each about half the time). */
double mo_eval_input_as(const char *name, uint64_t index, uint64_t seed, double scale,
			int32_t dtype);

/* Weights converted to the field once and reused by later evaluations of
 * the same program (they do not depend on the seed). */
struct mo_eval_cache {
	const struct mo_tp *tp;
	struct mo_ff **leaf; /* per tensor, or NULL */
};
void mo_eval_cache_free(struct mo_eval_cache *c);

/* The same, with float inputs drawn from [-scale, scale) and an optional
 * cache (zero-initialized before first use). */
enum mo_status mo_eval_scaled(const struct mo_tp *tp, enum mo_eval_domain domain,
			      uint64_t seed, double scale, struct mo_eval_cache *cache,
			      struct mo_eval_result *out, struct mo_diag *d);
/* The same, with the float input named `masked` (NULL: none) -inf over a
 * causal pattern of its last two dims (a single row: all but its first
 * third), as an attention mask is: the float check's masked trial. */
enum mo_status mo_eval_masked(const struct mo_tp *tp, enum mo_eval_domain domain,
			      uint64_t seed, double scale, const char *masked,
			      struct mo_eval_cache *cache, struct mo_eval_result *out,
			      struct mo_diag *d);

/* A chunk of rows of a larger evaluation, for proving a program
 * row-parallel: program A at R rows run on rows [first, first + R) of the
 * inputs program B sees at N rows. An input named in `names` has `per[i]`
 * elements a row: A's element k of it is B's element first * per + k while
 * its row (k / per) is below `valid`, and past that (padding: the rows B
 * does not have) a value of its own, drawn from another hash; an input not
 * named is B's, whole. */
struct mo_eval_rows {
	int64_t first, valid;
	int n;
	const char *const *names;
	const uint64_t *per;
	/* Or, with box_dims set (per and first unused): input names[i] is a
	 * box of B's tensor of dims box_dims[i], at box_off[i]: A's element at
	 * index x is B's at box_off + x where that lies inside B's dims, and
	 * box_pad[i] elsewhere (the float domain; the field's takes a value of
	 * its own there unless the pad is 0). */
	const int64_t (*box_dims)[MO_MAX_RANK];
	const int64_t (*box_off)[MO_MAX_RANK];
	const double *box_pad;
	/* the float domain's bool inputs (masks): MO_EVAL_BOOLS_DRAWN at
	 * random, or every element false (a row with nothing to attend to) or
	 * true, in every input, boxes included */
	enum { MO_EVAL_BOOLS_DRAWN, MO_EVAL_BOOLS_FALSE, MO_EVAL_BOOLS_TRUE } bools;
	/* the float domain's inputs named in lowest[0..n_lowest) hold their
	 * dtype's lowest finite value in every element, boxes included (a
	 * mask where nothing attends) */
	int n_lowest;
	const char *const *lowest;
};
/* The float value a walk with `rows` (NULL: none) gives element `index`
 * of input `name` of dtype, where no box names it: drawn (as
 * mo_eval_input_as), or the walk's fixed bool or lowest value. What the
 * plugin's float check feeds a kernel in the same trial. */
double mo_eval_rows_input(const struct mo_eval_rows *rows, const char *name, int32_t dtype,
			  uint64_t index, uint64_t seed, double scale);
/* mo_eval_masked's walk (nothing masked) with the inputs of `rows`. */
enum mo_status mo_eval_rows(const struct mo_tp *tp, enum mo_eval_domain domain, uint64_t seed,
			    const struct mo_eval_rows *rows, struct mo_eval_cache *cache,
			    struct mo_eval_result *out, struct mo_diag *d);

/* The most bytes of values a field walk of tp holds at once: its inputs and
 * the values of its ops, each freed after its last read (weights, converted
 * or read lazily, are not counted). UINT64_MAX when it cannot be counted. */
uint64_t mo_eval_working_set(const struct mo_tp *tp);
void mo_eval_result_free(struct mo_eval_result *r);

/* ---- the verdict ---- */

/* MO_UNPROVEN: a candidate that only passed the search's fast check, handed
 * to a caller that proves what it builds from it (never a final verdict). */
enum mo_verdict { MO_EQUIVALENT, MO_NOT_EQUIVALENT, MO_INCONCLUSIVE, MO_UNPROVEN };

struct mo_ref_memo;

struct mo_equiv_options {
	int trials;      /* finite-field trials that must all agree (default 3) */
	uint64_t seed;
	double rtol, atol; /* the float check */
	/* mo_mg_equiv: the reference program's results, kept between verdicts
	 * against the same program (NULL: evaluated afresh each time) */
	struct mo_ref_memo *memo;
};
#define MO_EQUIV_DEFAULTS { .trials = 3, .seed = 1, .rtol = 1e-4, .atol = 1e-5 }

struct mo_equiv_report {
	enum mo_verdict verdict;
	int trials_run, trials_inconclusive;
	double error_bound;  /* chance a wrong "equivalent" survives every trial */
	int degree;          /* the degree bound it is computed from */
	double float_max_abs, float_max_rel;
	char detail[512];    /* first differing output and element, or why */
};

/* A reference program's results, and its weights in the field, kept for
 * every μGraph checked or proven against it: the verdict's (each field
 * trial, each float scale; a search that proves several candidates of one
 * region, or a composite after a single kernel, evaluates the region once
 * per trial) and the fast check's (one seed, read per candidate). What the
 * verdict would keep past MO_REF_MEMO_BYTES is evaluated again instead; the
 * fast check's results are always kept (in `spare` when every entry is
 * taken). Not thread-safe: its users serialize. */
#define MO_REF_MEMO_BYTES (256u << 20)
#define MO_REF_MEMO_MAX 16
struct mo_ref_entry {
	enum mo_eval_domain dom;
	uint64_t seed;
	double scale;
	const char *masked;
	struct mo_eval_result r;
};
struct mo_ref_memo {
	const struct mo_tp *ref;
	struct mo_ref_entry e[MO_REF_MEMO_MAX];
	int n;
	size_t bytes;
	struct mo_ref_entry spare; /* the fast check's when e[] is full (r.n_outputs: 0, none) */
	struct mo_eval_cache weights;
	/* the field weights of a program over the same model held by another
	 * memo (a region's, for a run of its ops), borrowed instead of
	 * converting another copy as large; NULL: its own `weights` */
	struct mo_eval_cache *shared_weights;
	double ff_seconds; /* the last field evaluation of ref, timed (0: none yet) */
};
/* Empty, for verdicts against `ref` (which must outlive it). */
void mo_ref_memo_init(struct mo_ref_memo *m, const struct mo_tp *ref);
/* ref's field results for `seed` (scale 1, nothing masked), evaluated the
 * first time and kept: *out lives as long as m. */
enum mo_status mo_ref_memo_field(struct mo_ref_memo *m, uint64_t seed,
				 const struct mo_eval_result **out, struct mo_diag *d);
/* The seed of field trial t of a verdict with opt (the memo is primed with
 * trial 0's). */
uint64_t mo_equiv_trial_seed(const struct mo_equiv_options *opt, int t);
void mo_ref_memo_free(struct mo_ref_memo *m);
/* Evaluates ref for the first field trial of a verdict with `opt`'s seed
 * (m->ff_seconds: how long that took, what a search budgets its final proof
 * by). */
enum mo_status mo_ref_memo_prime(struct mo_ref_memo *m, const struct mo_equiv_options *opt,
				 struct mo_diag *d);

/* The unit roundoff of the coarsest float type an op of tp computes into
 * (2^-24 when all is fp32; Casts and layout ops do not count): how far two
 * correct evaluations of tp in its own precision may drift apart. */
double mo_tp_computed_roundoff(const struct mo_tp *tp);

/* Decides whether a and b compute the same outputs from the same inputs.
 * Their input and output names and shapes must match (MO_ERR_INPUT if not). */
enum mo_status mo_equiv(const struct mo_tp *a, const struct mo_tp *b,
			const struct mo_equiv_options *opt, struct mo_equiv_report *out,
			struct mo_diag *d);

/* A screen, not a verdict: does one field trial of a (the first of a verdict
 * with opt's seed) agree with ref's? ref's result comes from opt->memo when
 * it is ref's. *agree is false when they differ or the trial says nothing. */
enum mo_status mo_equiv_screen(const struct mo_tp *a, const struct mo_tp *ref,
			       const struct mo_equiv_options *opt, bool *agree, struct mo_diag *d);

/* ---- μGraphs: evaluating and proving ---- */

/* Evaluates the μGraph on the inputs `ref` would see (same names, same
 * hash) and `ref`'s weights; outputs in mg->kg.outputs order. */
enum mo_status mo_mg_eval(const struct mo_mugraph *mg, const struct mo_tp *ref,
			  enum mo_eval_domain domain, uint64_t seed, double scale,
			  struct mo_eval_result *out, struct mo_diag *d);

/* The same, with the reference's weights converted to the field once in
 * `weights` (zero-initialized before first use; mo_eval_cache_free after)
 * and the input `masked` (NULL: none) masked as mo_eval_masked does. */
enum mo_status mo_mg_eval_cached(const struct mo_mugraph *mg, const struct mo_tp *ref,
				 enum mo_eval_domain domain, uint64_t seed, double scale,
				 const char *masked, struct mo_eval_cache *weights,
				 struct mo_eval_result *out, struct mo_diag *d);

struct mo_quick_report {
	enum mo_verdict verdict; /* EQUIVALENT: every compared element agrees */
	uint64_t compared;       /* output elements compared */
};

/* The fast check the search runs on every candidate (DESIGN §6): one field
 * trial in which each graph-defined kernel that feeds only μGraph outputs
 * runs `blocks` of its blocks (drawn from the seed), compared on the
 * elements those blocks wrote with the reference's (kept in `ref`). NOT
 * EQUIVALENT on any difference (the search drops the candidate; an
 * uninterpreted op's identity may hide behind it, which only costs a
 * candidate), INCONCLUSIVE on a division by zero, EQUIVALENT when every
 * compared element agrees; then the full verdict decides. */
enum mo_status mo_mg_quick_check(const struct mo_mugraph *mg, struct mo_ref_memo *ref,
				 uint64_t seed, int blocks, struct mo_quick_report *rep,
				 struct mo_diag *d);

/* The verdict of mo_equiv, between a μGraph and the program it replaces. */
enum mo_status mo_mg_equiv(const struct mo_mugraph *mg, const struct mo_tp *ref,
			   const struct mo_equiv_options *opt, struct mo_equiv_report *out,
			   struct mo_diag *d);

#endif
