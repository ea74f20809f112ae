/* mo_export: the fused model (DESIGN §9).
 *
 * Each fused region becomes one node of the custom-op domain; every other
 * node, initializer, input, output and attribute stays as it was, byte for
 * byte. Nodes the fused nodes replace are removed; so, to a fixpoint, are
 * nodes (Constants included) none of whose outputs is read any more though
 * one was before, and initializers read before and not after. Reads count
 * from node inputs, graph outputs and subgraphs at any depth (a name a
 * subgraph reads from the main graph is an implicit input of the node that
 * owns the subgraph). Nodes and initializers nobody read in the loaded model
 * are kept; nodes making only folded values go when the fused graph would
 * otherwise be cyclic (mo_export_options.folded); a Shape of a value a
 * fused node makes is made from the graph inputs' shapes where the caller
 * says how (mo_export_options.shape_sources). An initializer that
 * goes takes its graph.input entry with it (an override of a tensor the model
 * no longer reads would otherwise be silently ignored); graph inputs without
 * an initializer are the model's interface and always stay. value_info
 * entries of tensors that no longer exist go. The node list is put back in
 * topological order, stably: untouched nodes keep their relative order and a
 * fused node takes the place of the first node it replaces unless its inputs
 * come later. `opset_import` gains the domain at version 1 unless it has it;
 * `metadata_props` gains mirage.plugin, mirage.manifest, mirage.build and
 * mirage.input_shapes (the plugin's and manifest's file names, the build id,
 * the shapes fused for), each replacing an old value. Each fused op type
 * becomes a model-local function too, its body the region the first node of
 * that type replaces (with Constants for the initializers and Constant
 * outputs it reads, and for values the importer folded; one folded at one
 * size of dims left unbound (mo_fused_const.sized) is recomputed there by
 * the model's shape arithmetic from the op's inputs, or the op has no
 * body), so that a runtime without the plugin runs the original
 * ops; the IR version becomes 8 where it was older. A node with guards is
 * written inside an If, so that sizes past what the op serves run the
 * original ops (mo_fused_node.guards). The model is written
 * atomically (mo_onnx_save).
 *
 * The loaded model is not changed: the edit is built on the side and exists
 * only in the written file, so pointers into `m` stay valid and `m` can be
 * exported again. A fused-node list that does not fit the graph (an index out
 * of range or claimed twice, an output its nodes do not make, a tensor still
 * read that no fused node outputs, a cyclic result) is MO_ERR_INTERNAL; on any
 * error nothing is written. */
#ifndef MO_EXPORT_H
#define MO_EXPORT_H

#include "mo_base.h"
#include "mo_onnx.h"

/* A value the importer computed (a folded shape chain, a cast of a
 * constant) that the replaced nodes read and no Constant node or
 * initializer holds: the fused op's function body defines it. With
 * `outer`, a constant a decomposed node made for one of its steps (Mean's
 * count, an epsilon) that the fused op reads as an input (a μGraph of
 * several kernels passes it between them): the fused graph holds it as an
 * initializer, as no node of the model makes it; or what a node folded
 * whole that the fused node replaces made (a Shape of a tensor the fused op
 * keeps inside), which nodes outside read. */
struct mo_fused_const {
	const char *name;
	int32_t dtype;        /* float, float16, bfloat16, double, int64, int32 or bool */
	int rank;
	const int64_t *dims;
	size_t n;
	const double *fvals;  /* float types */
	const int64_t *ivals; /* integer and bool types */
	bool outer;
	bool sized; /* this size's only (dims left unbound): no function body
		     * holds it, so an op reading it has none */
};

/* A dim a fused op serves only up to a size (fuse/dynamic.c's padded ops):
 * the fused node's input `input`, its dim `axis`, at most `most`. */
struct mo_fused_guard {
	int input, axis;
	int64_t most;
};

struct mo_fused_node {
	const char *op_type;  /* the custom op's name (stable, from the region's hash) */
	const char *name;     /* the node's name (unique in the graph) */
	int n_nodes;
	const int *nodes;     /* indices into graph->node as loaded, any order */
	int n_inputs, n_outputs;
	const char *const *inputs;  /* tensor names, in the custom op's order; "" = omitted */
	const char *const *outputs; /* tensor names the replaced nodes made */
	int n_consts;
	const struct mo_fused_const *consts;
	/* With guards (and the outputs' dtypes): the node is an If that runs
	 * the op while every guarded dim is within its size and, past it, the
	 * nodes it replaces (in the If's other branch, reading the main
	 * graph's values) */
	int n_guards;
	const struct mo_fused_guard *guards;
	const int32_t *out_dtypes;
	/* With guards: past them, these ops (guarded too, their sizes
	 * larger: a padded op's next bucket, whole or in parts) in place of
	 * the original nodes they replace, each a subset of these nodes, no
	 * node in two; the nodes none replaces run as they were. n_next 0:
	 * the original nodes. */
	int n_next;
	const struct mo_fused_node *next;
};

/* The shape of a value (`of`) told by the graph inputs' shapes: dim d is
 * value[d] times dim axis[d] of graph input input[d], or the constant
 * value[d] where input[d] is NULL. */
struct mo_shape_source {
	const char *of;
	int rank;
	const char *const *input;
	const int *axis;
	const int64_t *value;
};

struct mo_export_options {
	const char *domain;      /* custom-op domain (the plugin's mo_plugin_domain) */
	/* recorded under metadata_props mirage.plugin, mirage.manifest and
	 * mirage.build when not NULL */
	const char *plugin_file;   /* the plugin's file name */
	const char *manifest_file; /* the manifest's file name */
	const char *build_id;      /* the plugin's build id */
	/* under mirage.input_shapes: the shapes the fused ops were made for, a
	 * JSON object of graph input name to dims ({"ids": [2, 8]}), so that a
	 * runner (mirage-onnx bench) can feed them when the inputs' own dims are
	 * symbolic */
	const char *input_shapes;
	/* values the importer folded whole (shapes of tensors whose dims the
	 * user bound, and what is computed from them), by name. Only when the
	 * graph with the fused nodes would be cyclic (a Slice outside them
	 * reading a size computed from a Shape of what one of them makes, as
	 * Phi-3's rotary embedding slices by the cos table's width): then each
	 * node outside the fused ones that makes nothing but such values goes,
	 * the written graph holds the values as initializers, and what only
	 * those nodes read goes too */
	const struct mo_fused_const *folded;
	size_t n_folded;
	/* when set, called with each fused op type for which the written model
	 * holds no function body (one its nodes need a value the op does not
	 * take as an input for, such as the Shape of the KV cache a padded
	 * attention's repeat_kv reshapes by): a runtime without the plugin's
	 * kernel for it cannot run the model */
	void (*no_function)(void *ctx, const char *op_type);
	void *no_function_ctx;
	/* dim_params of the graph's inputs, outputs and value infos written as
	 * another text (reading_of[i] as read_as[i]): the derived dims the
	 * fuse read as the graph needs them (mo_import_readings), so that the
	 * fused model declares what it was made for */
	int n_readings;
	const char *const *reading_of;
	const char *const *read_as;
	/* shapes of values a fused node makes, told otherwise: a Shape node
	 * the fused nodes leave that reads such a value (its own when it is
	 * not an output, or one the fused node must make first) reads the
	 * inputs' shapes instead (Shape, Gather and Concat nodes in its
	 * place), so that nothing waits for the fused node to learn a size
	 * (Qwen2's rotary slices its cos table to the length of the keys it
	 * rotates: the Shape of those keys, fused with the rotation, would be
	 * on a cycle) */
	int n_shape_sources;
	const struct mo_shape_source *shape_sources;
};

/* Writes m, its main graph rewritten with the fused nodes, to out_path. With
 * out_path NULL it only checks that the fused nodes fit the graph. */
enum mo_status mo_export(struct mo_model *m, const struct mo_fused_node *fused, int n_fused,
			 const struct mo_export_options *o, const char *out_path,
			 struct mo_diag *d);

#endif
