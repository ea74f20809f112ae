/* Hand-built μGraphs shared by the tests and the benchmarks. */
#ifndef MUGRAPHS_H
#define MUGRAPHS_H

#include "mo_import.h"
#include "mo_mugraph.h"

/* A benchmark model of the `test_models` fixture (the folder named by
 * MO_TEST_MODELS) and its tensor program; aborts with the reason when it
 * cannot be loaded. */
struct test_program {
	struct mo_model *m;
	struct mo_tp *tp;
};
struct test_program test_program_load(const char *name);
void test_program_free(struct test_program *p);

/* A kernel-graph input mirroring the program's tensor of that name. */
int mg_program_input(struct mo_mugraph *mg, const struct mo_tp *p, const char *name);

/* RMSNorm + MatMul as one kernel (the paper's Figure 3b), for a program with
 * inputs X [rows, hidden], weights norm.weight [hidden] and proj.weight
 * [hidden, out], output /proj/MatMul_output_0 (models/build.py's rmsnorm).
 * Grid x splits the output columns, y the rows; the for-loop walks hidden. */
enum rms_mutant {
	RMS_OK,
	RMS_WRONG_IMAP,      /* X's rows chunked by grid x instead of y */
	RMS_WRONG_FMAP,      /* the sum of squares reads whole rows every iteration */
	RMS_NO_DIVISION,
	RMS_WRONG_ACCUM_DIM, /* the sum of squares over rows and columns */
	RMS_OFF_BY_ONE,      /* the mean divides by hidden - 1 */
	RMS_SWAPPED_DIV,
	RMS_EXTRA_EXP,
	RMS_MUTANTS
};
struct mo_mugraph *mg_rmsnorm_matmul(const struct mo_tp *p, enum rms_mutant mut, int grid_x,
				     int grid_y, int forloop);
/* That kernel (grid (3, 4, 1), a for-loop of 4) with its result's columns
 * 0..cut-1 and cut..95 also saved as "q" and "k": two Slice kernels
 * absorbed (mo_mg_absorb_copies), so one kernel over a for-loop saving
 * three tiles after it. At a cut of 64 (whole tiles of grid x's 32
 * columns) q's and k's savers are ranged (blocks x 0..1 and 2); at 48 grid
 * x is dropped and each part a block Slice. NULL when the absorption fails. */
struct mo_mugraph *mg_rmsnorm_matmul_sliced(const struct mo_tp *p, int64_t cut);

/* GatedMLP silu(X·W1) ⊙ (X·W2) in one kernel (models/build.py's gated_mlp).
 * mut 0 is the correct graph; 1..5 are the mutants listed at the builder. */
struct mo_mugraph *mg_gated_mlp(const struct mo_tp *p, int mut);
/* LoRA X·W + (X·A)·B as [X, XA]·[W; B] (lora); mutants 1..4. */
struct mo_mugraph *mg_lora(const struct mo_tp *p, int mut);
/* Attention as split-KV partial sums + a combine kernel (gqa); mutants 1..5. */
struct mo_mugraph *mg_attention_split_kv(const struct mo_tp *p, int mut);

/* Attention in one kernel with online softmax (max-rescaled accumulators,
 * a thread graph for exp(S − m)) (gqa); mutants 1..4. */
struct mo_mugraph *mg_attention_flash(const struct mo_tp *p, int mut);

#endif
