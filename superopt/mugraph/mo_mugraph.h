/* μGraphs (paper §2): a kernel graph whose ops are pre-defined kernels or
 * graph-defined kernels; a graph-defined kernel owns a block graph with grid
 * dims, a for-loop range, input iterators (imap: grid dim -> tensor dim or φ,
 * fmap: for-loop -> tensor dim or φ), block ops over tiles in shared memory,
 * accumulators across for-loop iterations, and output savers (omap).
 *
 * A block graph's body is itself a small tensor program over tiles, so the
 * ops, their shape inference and both evaluators are the tensor program's.
 * The algorithm (ops and edges) is the body; the schedule is grid, for-loop
 * and maps. */
#ifndef MO_MUGRAPH_H
#define MO_MUGRAPH_H

#include "mo_tp.h"

#define MO_PHI (-1)        /* a map entry meaning "replicated": no tensor dim */
#define MO_MG_MAX 48       /* tensors / ops per graph level */

enum mo_accum_kind {
	MO_ACC_SUM,      /* Σ_i x_i over the for-loop iterations */
	MO_ACC_MAX,      /* the running max M of x_i (online softmax's max) */
	MO_ACC_RESCALED, /* Σ_i x_i·exp(m_i − M): the max-rescaled sum of online
			  * softmax, m_i the iteration's max tile, M their running
			  * max; kept as acc·exp(M_old − M_new) + x_i·exp(m_i − M_new),
			  * each factor 0 while M_new is −inf (every score so far
			  * masked: x_i is 0, and exp(−inf − −inf) would be NaN) */
};

struct mo_bg_iter {
	int tile;     /* body tensor it fills */
	int tensor;   /* kernel tensor it reads */
	int imap[3];  /* grid dim x,y,z -> tensor dim, or MO_PHI */
	int fmap;     /* for-loop -> tensor dim, or MO_PHI */
};

struct mo_bg_accum {
	int in, out;  /* per-iteration tile -> accumulated tile */
	enum mo_accum_kind kind;
	int max_in;   /* MO_ACC_RESCALED: the tile m_i (broadcast over in); else -1 */
};

/* A thread graph (paper §2.3): a chain of element-wise block ops that each
 * thread runs on its own elements in registers, so the tiles between them
 * never touch shared memory. Body ops first..last (contiguous, in order). */
struct mo_thread_graph {
	int first, last;
};

#define MO_BLOCK_THREADS 128 /* threads per block of every graph-defined kernel */
/* A register thread graph is one loop over the elements a thread owns, one
 * element's chain live at a time; nvcc unrolls such a loop about 4 times,
 * so at most that many elements' values are live at once (plan.c) */
#define MO_TG_UNROLL 4

/* A saver writes its tile from every block, or, ranged (hi > 0), only from
 * the blocks whose index along grid dim `dim` lies in [lo, hi): the tensor
 * it makes then holds hi − lo tiles along that dim's tensor dim, block lo's
 * first. A Split of a projection whose grid splits its columns saves each
 * part from the blocks that compute it (mo_mg_absorb_copies). */
struct mo_bg_range {
	int dim, lo, hi;
};

struct mo_bg_saver {
	int tile;     /* body tensor it writes */
	int tensor;   /* kernel tensor it makes */
	int omap[3];  /* grid dim -> tensor dim, or MO_PHI */
	struct mo_bg_range range; /* hi 0: every block saves */
};

struct mo_block_graph {
	int index; /* creation order among the μGraph's block graphs */
	int grid[3];
	int forloop;
	struct mo_tp body; /* tiles (tensors) and block ops, in topological order */
	int n_iters, n_accums, n_savers;
	struct mo_bg_iter iters[MO_MG_MAX];
	struct mo_bg_accum accums[MO_MG_MAX];
	struct mo_bg_saver savers[MO_MG_MAX];
	int n_tgs;
	struct mo_thread_graph tgs[MO_MG_MAX / 2];
};

struct mo_kg_op {
	struct mo_block_graph *bg; /* graph-defined, or NULL: op is a pre-defined kernel */
	struct mo_tp_op op;        /* over kernel tensors (pre-defined only) */
};

/* Every builder call is logged, so a μGraph serializes as the calls that
 * build it and deserializes by replaying them (tensor numbers included). */
enum mo_mg_step_kind {
	MO_STEP_INPUT, MO_STEP_KERNEL, MO_STEP_OUTPUT, MO_STEP_BLOCK, MO_STEP_ITER,
	MO_STEP_OP, MO_STEP_CONST, MO_STEP_ACCUM, MO_STEP_SAVE, MO_STEP_THREAD,
};

struct mo_mg_step {
	enum mo_mg_step_kind kind;
	int block;        /* block graph index (ITER, OP, CONST, ACCUM, SAVE) */
	enum mo_op op;    /* KERNEL, OP */
	int n_in, in[3];  /* KERNEL, OP; in[0]: the tensor of ITER/ACCUM/SAVE/OUTPUT */
	struct mo_op_params p;
	int64_t sizes[MO_MAX_RANK]; /* p.sizes, copied */
	int map[3], fmap; /* ITER imap / SAVE omap */
	struct mo_bg_range range; /* SAVE */
	int grid[3], forloop;
	double value;     /* CONST */
	const char *name; /* INPUT, OUTPUT */
	int32_t dtype;
	int rank;
	int64_t dims[MO_MAX_RANK];
};

#define MO_MG_MAX_STEPS (MO_MG_MAX * 6)

struct mo_mugraph {
	struct mo_arena arena;
	int n_steps;
	struct mo_mg_step steps[MO_MG_MAX_STEPS];
	int n_blocks;
	struct mo_block_graph *blocks[MO_MG_MAX];
	struct mo_tp kg;   /* kernel tensors: inputs bound by name to the program's
			    * inputs and weights; kg.outputs names the results */
	int n_ops;
	struct mo_kg_op ops[MO_MG_MAX];
	char error[256];   /* first builder error; the graph is unusable if set */
	/* per kernel tensor made by a kernel: the dtype its producer computes
	 * (a saved tile's, a pre-defined op's inferred one). Such a tensor is
	 * stored as fp32 while it only passes between kernels (split-KV's
	 * partial maxes, numerators and denominators lose range and precision
	 * in fp16), and as this dtype once mo_mg_output names it. */
	int32_t made_dtype[MO_MG_MAX];
};

/* ---- building (the search and the tests use these) ----
 * Every builder returns a tensor index, or -1 after recording an error in
 * mg->error (an infeasible candidate, the `try_` idiom): callers check once at
 * the end. */
struct mo_mugraph *mo_mg_new(void);
void mo_mg_free(struct mo_mugraph *mg);
int mo_mg_input(struct mo_mugraph *mg, const char *name, int32_t dtype, int rank,
		const int64_t *dims);
/* A pre-defined kernel op (MatMul, Add, ReduceSum, ...) with params p. */
int mo_mg_kernel(struct mo_mugraph *mg, enum mo_op kind, int n_in, const int *in,
		 const struct mo_op_params *p);
/* Names a kernel tensor as a program output (stored in the dtype its
 * producer computes, no longer fp32 as between kernels). */
void mo_mg_output(struct mo_mugraph *mg, int tensor, const char *name);
/* Renames the μGraph's inputs and outputs: to(ctx, name) gives a name's new
 * one, NULL for a name it does not know. False when one is unknown or out of
 * memory (then some may be renamed: the caller drops the μGraph). The cache
 * keeps a μGraph under names that are the same for regions that differ in
 * names alone, and gives it the names of the region it is read for. */
bool mo_mg_rename(struct mo_mugraph *mg, const char *(*to)(void *ctx, const char *name),
		  void *ctx);
/* Gives each output the dtype of the program's output of the same name: a
 * fused node declares, and its kernels store, exactly the types of the
 * tensors it replaces (an fp16 region may end in a Cast to fp32). */
void mo_mg_output_dtypes(struct mo_mugraph *mg, const struct mo_tp *prog);

struct mo_block_graph *mo_mg_block(struct mo_mugraph *mg, int gx, int gy, int gz,
				   int forloop);
int mo_bg_iter(struct mo_mugraph *mg, struct mo_block_graph *bg, int tensor,
	       int ix, int iy, int iz, int fmap);
int mo_bg_op(struct mo_mugraph *mg, struct mo_block_graph *bg, enum mo_op kind, int n_in,
	     const int *in, const struct mo_op_params *p);
/* Block op tile y of kind just made in body: its dtype fp32 when its
 * operands' gave it a 2-byte one (what a tile holds; a Cast's keeps its
 * target). mo_bg_op does it; the search's own tiles too. */
void mo_bg_label_tile(struct mo_tp *body, enum mo_op kind, int y);
/* Whether op, in a block graph's body, is a Sub of a ReduceMax's result
 * (softmax's x − max(x), the only use of ReduceMax in block graphs: the
 * Lax fragment has no ReduceMax of its own). Such a Sub gives −inf where
 * the max is −inf: a row of a tile whose scores are all masked is 0 after
 * the Exp and adds nothing, as in FlashAttention, instead of NaN
 * (−inf − −inf). Evaluators and generated code all follow this. */
bool mo_bg_sub_of_max(const struct mo_tp *body, const struct mo_tp_op *op);
/* A scalar constant tile (for eps, 1/n, ...). */
int mo_bg_const(struct mo_mugraph *mg, struct mo_block_graph *bg, double value);
/* A sum or max accumulator (MO_ACC_SUM, MO_ACC_MAX). */
int mo_bg_accum(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
		enum mo_accum_kind kind);
/* The max-rescaled sum of `tile` against the iteration's max tile `max_tile`
 * (same rank, each dim equal or 1). Accumulators sharing a max tile share M,
 * so their quotient is exact; MO_ACC_MAX of the same tile gives M itself. */
int mo_bg_accum_rescaled(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
			 int max_tile);
/* Makes the body ops that produced tiles first..last (all element-wise, one
 * contiguous run) a thread graph. Returns its index. */
int mo_bg_thread_graph(struct mo_mugraph *mg, struct mo_block_graph *bg, int first_tile,
		       int last_tile);
/* Saves a tile; returns the kernel tensor it becomes. */
int mo_bg_save(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
	       int ox, int oy, int oz);
/* The same from the blocks of range r only (struct mo_bg_range; r.hi 0:
 * every block): r.dim a grid dim of more than one block that the omap maps
 * to a tensor dim, 0 ≤ lo < hi ≤ its blocks. */
int mo_bg_save_range(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
		     const int *omap, struct mo_bg_range r);

/* ---- composing ---- */

/* Replays src's build steps into dst, after what dst already holds: a src
 * input whose name is bound_names[k] reads dst tensor bound[k] (a result of
 * an earlier kernel); any other src input becomes the dst input of that name
 * (one per name). src's outputs are not named in dst: their dst tensors go
 * to outs (src->kg.n_outputs of them, in order). Returns how many, or -1
 * with dst->error set. */
int mo_mg_append(struct mo_mugraph *dst, const struct mo_mugraph *src, int n_bound,
		 const char *const *bound_names, const int *bound, int *outs);

/* src (one graph-defined kernel whose for-loop feeds sum or max-rescaled
 * accumulators, with a grid dim of 1) as two kernels: the loop split across
 * `parts` blocks along that grid dim, saving partial results, then a kernel
 * that combines them and runs the rest (superopt/mugraph/split.c). NULL when src
 * does not qualify. */
struct mo_mugraph *mo_mg_split_loop(const struct mo_mugraph *src, int parts);

/* src with each run of consecutive graph-defined kernels without a for-loop,
 * the same grid, each reading the tiles the one before saved through the
 * same maps, as one kernel (superopt/mugraph/merge.c). With MO_MERGE_DROP, a
 * grid dim of the kernel before that splits an axis the next one reads
 * whole is dropped too (each block of the merged kernel does that work for
 * the whole axis: a norm's rows in every block of a projection); with
 * MO_MERGE_REGRID also one it splits into more or fewer blocks than the
 * next one does becomes the next one's (each block does the work of
 * several, or a part of one's: the rotary of 8 query heads done in 2
 * blocks of 4, by the attention's blocks over 2 KV heads); with either,
 * NULL unless one is. NULL when no two kernels merge (or out of memory, or
 * a builder refused the result). */
enum mo_merge_grid {
	MO_MERGE_SAME_GRID, /* only kernels whose shared grid dims are the same */
	MO_MERGE_DROP,      /* and dropping a grid dim the next kernel reads whole */
	MO_MERGE_REGRID,    /* and coarsening or refining one it splits otherwise */
};
struct mo_mugraph *mo_mg_merge_kernels(const struct mo_mugraph *src, enum mo_merge_grid regrid);
/* The same for one pair: block graph b (creation order, > 0) merged into
 * the kernel just before it, nothing else (NULL when they do not merge).
 * Merging every pair at once may make one kernel too large where merging
 * some is best: a norm's kernel into the projections', and not those into
 * the down projection's (whose blocks would then compute every column). */
struct mo_mugraph *mo_mg_merge_pair(const struct mo_mugraph *src, int b,
				     enum mo_merge_grid regrid);
/* src with each pre-defined Slice kernel (one axis, step 1) over a tensor
 * a block saved made by that block instead: where a grid dim splits the
 * axis into tiles the slice's ends fall between, a ranged saver of the
 * blocks that compute it; else a block Slice of the saved tile and its own
 * saver, the grid dim that split the axis dropped. Each pre-defined
 * Transpose kernel over such a tensor likewise: every block transposes its
 * tile and saves it where it lands in the result. NULL when there is none
 * (or out of memory, or a builder refused the result). */
struct mo_mugraph *mo_mg_absorb_copies(const struct mo_mugraph *src);

/* ---- serializing ---- */

/* The μGraph as JSON: {"steps": [...]} in build order. */
void mo_mg_print_json(const struct mo_mugraph *mg, FILE *out);
/* The same text as a malloc'd string (free it), or NULL when out of memory. */
char *mo_mg_json(const struct mo_mugraph *mg);
/* The same into a file: written whole to a temporary and renamed into place
 * (d says why not, errno set). */
enum mo_status mo_mg_write_json(const struct mo_mugraph *mg, const char *path, struct mo_diag *d);
/* Rebuilds a μGraph from mo_mg_print_json's text. */
enum mo_status mo_mg_from_json(const char *text, struct mo_mugraph **out, struct mo_diag *d);
/* The μGraph for Graphviz: one cluster per graph-defined kernel. */
void mo_mg_print_dot(const struct mo_mugraph *mg, FILE *out);

/* ---- checking ---- */

enum mo_target { MO_SM80, MO_SM90 };
/* Shared memory a block may use: sm_80 163 KB, sm_90 227 KB. */
uint64_t mo_target_smem(enum mo_target t);
/* Shared memory a block may opt into (cudaDevAttrMaxSharedMemoryPerBlockOptin)
 * on the GPUs of an SM version a plugin is compiled for: 75 64 KB, 80 163 KB,
 * 86 and 89 99 KB, 90 227 KB; 0 for a version not in this table. */
uint64_t mo_arch_smem(int sm);
/* The GPUs a plugin compiled for `archs` ("80,90": the SM versions of
 * --cuda-arch) runs on, as SM versions with their shared memory, largest
 * first, at most max; their number. Machine code for sm_X.Y also runs on
 * the later GPUs of the same major version, so sm_80 code runs on sm_86 and
 * sm_89 (99 KB): 80 brings 86 with it unless 86 or 89 is listed. Versions
 * not in mo_arch_smem's table are skipped. */
int mo_arch_gpus(const char *archs, int *sm, uint64_t *lim, int max);
/* Registers: 64 K 32-bit registers per SM and at most 255 per thread, on both. */
int mo_target_regs_per_thread(enum mo_target t);
int mo_target_regs_per_sm(enum mo_target t);

/* Where a block graph's tiles live (the paper's §6 memory plan). The code
 * generator lays tiles out by it and the search's memory check counts it,
 * so what the search accepts is what the kernel asks for.
 * - Schedule: the for-loop's iterators, then its body ops by depth, then
 *   its accumulators; after the loop, the remaining body ops by depth and
 *   the savers. A unit (a block op, or a register thread graph: below) runs
 *   as early as what it reads allows, so units of one depth share the
 *   barrier before them; ties keep the body's order.
 * - Lifetimes, in steps (the iterators; each depth of the loop; the
 *   accumulators; each depth after the loop; the savers): a tile takes
 *   shared memory from the step that writes it to the step of its last
 *   reader; an accumulator, and online softmax's running and new max, for
 *   the whole for-loop and until last read. Buffers whose lifetimes do not
 *   meet share bytes (first fit by start; 32-byte aligned, as tensor-core
 *   fragments need). So bytes change hands only between depths, where the
 *   barrier before a depth's reads stands anyway; the code generator still
 *   checks, and puts a barrier before any write into bytes another buffer
 *   used since the last one. (mo_bg_plan_pipelined: iterator tiles twice
 *   over, for the whole loop.)
 * - Types: a tile an iterator loads keeps its tensor's storage type (2 bytes
 *   per element for fp16 and bf16: loads are exact); computed tiles are
 *   fp32, so arithmetic and accumulation stay fp32.
 * - Thread graphs: one whose ops each make a tile of one shape, in one
 *   phase, reading the run's own tiles without broadcasting, runs as one
 *   loop, and its tiles read nowhere else live in registers. Any other
 *   thread graph runs op by op through shared memory. */
struct mo_bg_plan {
	bool post[MO_MG_MAX];     /* tile exists only after the for-loop */
	int tg_last[MO_MG_MAX];   /* body op that starts a register thread graph:
				   * its last op; otherwise -1 */
	bool in_reg[MO_MG_MAX];   /* tile held in a thread graph's registers */
	int n_order, order[MO_MG_MAX]; /* the units' first body ops, in the order
					* they run (both phases) */
	uint8_t elem[MO_MG_MAX];  /* bytes per element in shared memory; 0: none
				   * (a constant or a register tile) */
	uint64_t off[MO_MG_MAX];  /* byte offset of each tile */
	bool pipelined;           /* iterator tiles have two halves (below) */
	uint64_t off2[MO_MG_MAX]; /* an iterator tile's second half (= off
				   * when not pipelined) */
	uint64_t off_run[MO_MG_MAX], off_new[MO_MG_MAX]; /* per rescaled accumulator */
	uint64_t bytes;           /* shared memory per block */
	uint64_t bytes_unshared;  /* the same buffers laid end to end */
	uint64_t off_stage;       /* per-warp staging of fp32 MatMul operands for
				   * tensor cores (MO_MMA_STAGE_BYTES a warp,
				   * at the end); 0 bytes when none is */
};
void mo_bg_plan(const struct mo_block_graph *bg, struct mo_bg_plan *p);
/* The plan the code generator lays kernels out by: with a for-loop of more
 * than one iteration, iterator tiles get two halves that iterations use in
 * turn (double buffering: iteration it + 1's tiles load, asynchronously on
 * the GPU, while iteration it computes), so they hold their bytes for the
 * whole loop. Where that does not fit smem_limit, mo_bg_plan's plan.
 * Returns whether the tiles are double-buffered. The search checks
 * mo_bg_plan's plan: what it accepts always has one that fits. */
bool mo_bg_plan_pipelined(const struct mo_block_graph *bg, uint64_t smem_limit,
			  struct mo_bg_plan *p);
/* Shared memory per block of a block graph's plans: single-buffered
 * (mo_bg_plan) and double-buffered (0 when its for-loop has one iteration
 * or no iterator, so there is no such plan). */
void mo_bg_plan_bytes(const struct mo_block_graph *bg, uint64_t *single, uint64_t *dbuf);
/* The most shared memory a block of the μGraph needs when every kernel runs
 * its single-buffered plan: the μGraph runs on a GPU with at least this
 * much (0: no graph-defined kernel). */
uint64_t mo_mg_smem(const struct mo_mugraph *mg);

/* How body op i, a MatMul, runs on tensor cores (code generation, and the
 * plan's staging area): fragments of fm×fn×16 (16×16, or 8×32 for tiles of
 * 8 rows) in storage type `dtype` (fp16 or bf16) with fp32 accumulation.
 * An operand that is a 2-byte tile (an iterator's) is read in place; an
 * fp32 tile (computed) is `staged`: each warp rounds the fragment it needs
 * to `dtype` in its own slice of shared memory, so the product is that of
 * the rounded operand (the CPU kernel rounds the same way). False, and
 * the scalar loop, for kernels of fp32 tensors, constant or register
 * operands, dims that do not divide into fragments, or operands that
 * broadcast other than as whole matrices. */
struct mo_bg_mma {
	int fm, fn;
	int32_t dtype;
	bool stage[2];
	bool trans_b; /* B's tile read as [N, K] (a column-major fragment) */
};
#define MO_MMA_STAGE_BYTES 1536 /* a warp's staged A (≤ 256) and B (≤ 512) halves */
bool mo_bg_mma(const struct mo_block_graph *bg, const struct mo_bg_plan *p, int i,
	       struct mo_bg_mma *m);

/* What a block graph needs: shared memory (mo_bg_plan's bytes) and
 * registers per thread (the largest register thread graph's estimate: 16
 * for addressing plus, per element a thread owns, one register per value
 * live across the chain). */
struct mo_bg_usage {
	uint64_t smem;
	int regs_per_thread;
};
void mo_bg_usage(const struct mo_block_graph *bg, struct mo_bg_usage *u);

/* Definition 2.1: shapes match (inferred at build), maps divide the dims,
 * tiles fit shared memory and thread graphs the register file, and in a
 * for-loop every path from an iterator to a saver crosses one accumulator. */
bool mo_mg_valid(const struct mo_mugraph *mg, enum mo_target target, char *why,
		 size_t why_len);
/* The same with smem_limit bytes of shared memory per block instead of the
 * target's (> 0; a μGraph for a GPU with less than the target). */
bool mo_mg_valid_smem(const struct mo_mugraph *mg, enum mo_target target, uint64_t smem_limit,
		      char *why, size_t why_len);

#endif
