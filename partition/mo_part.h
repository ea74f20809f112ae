/* mo_part: the Lax partitioner (DESIGN §4).
 *
 * Groups the fusable ops of a tensor program into regions that the search
 * superoptimizes one at a time. Every region is convex, and collapsing all
 * regions at once leaves the graph acyclic; no path inside a region crosses
 * more than one exp; a region stays within the size the search can handle
 * (ops, and MatMuls chained on one path). Merges are made greedily along the
 * edges whose tensors are largest first, because keeping the largest
 * intermediates on chip is what fusion buys: that keeps RMSNorm with the
 * MatMul it feeds, a gated MLP whole, and attention's MatMul-Softmax-MatMul
 * together when a larger region would break a limit. */
#ifndef MO_PART_H
#define MO_PART_H

#include "mo_tp.h"

struct mo_part_options {
	int max_ops;          /* ops in one region */
	int max_matmul_chain; /* MatMul/Gemm on any one path inside a region */
	int max_exps;         /* exps on any one path inside a region (Lax: 1) */
};
#define MO_PART_DEFAULTS { .max_ops = 32, .max_matmul_chain = 2, .max_exps = 1 }

struct mo_region {
	int n_ops, n_nodes, n_inputs, n_outputs;
	int *ops;      /* TP op indices, in topological order */
	int *nodes;    /* ONNX nodes it replaces: its ops' nodes and the
			* Constant / folded nodes only it uses; ascending */
	int *inputs;   /* tensors read from outside, first use order */
	int *outputs;  /* tensors used outside or graph outputs */
	int exps;      /* most exps on one path */
	int matmul_chain;
	uint64_t flops;
	uint64_t bytes_fused;   /* inputs + outputs: what one fused kernel moves */
	uint64_t bytes_unfused; /* every op's inputs + outputs, op by op */
};

struct mo_partition {
	struct mo_arena arena;
	int n_regions;
	struct mo_region *regions;
	int *op_region; /* region of each TP op, -1 if none */
};

enum mo_status mo_part_run(const struct mo_tp *tp, const struct mo_part_options *opt,
			   struct mo_partition **out, struct mo_diag *d);
/* The partition whose region k is the ops v with group[v] == k (-1: in
 * none), for groups the caller chose (the parts of a region the search
 * found to fuse): each group must be convex, and collapsing them all must
 * leave the graph acyclic (mo_part_check), which the caller ensures. */
enum mo_status mo_part_groups(const struct mo_tp *tp, const int *group,
			      struct mo_partition **out, struct mo_diag *d);
void mo_part_free(struct mo_partition *p);
/* Whether ONNX node `node` is folded whole: it made no TP op and every
 * tensor it makes is a value the importer computed (a Shape of a tensor of
 * bound dims). A region does not output a tensor only such nodes read
 * outside it; the fused model holds their values instead. */
bool mo_part_folded_reader(const struct mo_tp *tp, int node);

/* Checks the two properties everything downstream relies on: every region is
 * convex, and the graph with every region collapsed to one node is acyclic.
 * Returns false with a description in why (for tests). */
bool mo_part_check(const struct mo_tp *tp, const struct mo_partition *p,
		   char *why, size_t why_len);

/* --list-regions, as text, as JSON (the regions of pad too, when not
 * NULL: those fused padded, numbered after p's, "padded": true), and the
 * graph for Graphviz. */
void mo_part_print(const struct mo_tp *tp, const struct mo_partition *p,
		   const struct mo_partition *pad, FILE *out);
void mo_part_print_json(const struct mo_tp *tp, const struct mo_partition *p,
			const struct mo_partition *pad, FILE *out);
void mo_part_print_dot(const struct mo_tp *tp, const struct mo_partition *p, FILE *out);

#endif
