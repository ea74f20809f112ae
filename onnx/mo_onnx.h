/* mo_onnx: ONNX models in and out.
 *
 * The model is the protobuf-c representation generated at build time from the
 * system's onnx.proto, so every later stage reads the same structs that are
 * written back. Fields this onnx.proto does not know are kept by protobuf-c and
 * written back as they were: a model that nothing changed round-trips byte for
 * byte. Tensors stored as external data are memory-mapped, never copied. */
#ifndef MO_ONNX_H
#define MO_ONNX_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "mo_base.h"
#include "onnx.pb-c.h"

struct mo_model;

/* Loads a model file. `path` may be relative; external data locations are
 * resolved against the model's folder and must stay inside it. */
enum mo_status mo_onnx_load(const char *path, struct mo_model **out,
			    struct mo_diag *d);

/* Loads a model from memory (the buffer is not kept). `dir` is the folder that
 * external data is relative to, or NULL to reject external data. `name` is how
 * messages refer to the model. */
enum mo_status mo_onnx_load_buffer(const uint8_t *buf, size_t len,
				   const char *dir, const char *name,
				   struct mo_model **out, struct mo_diag *d);

void mo_onnx_free(struct mo_model *m);

/* The model's protobuf; stages may read it freely and edit it in place. */
Onnx__ModelProto *mo_onnx_proto(const struct mo_model *m);

/* Whether node n is op_type op of the default domain ("" or "ai.onnx"). */
bool mo_onnx_node_is(const Onnx__NodeProto *n, const char *op);

/* Node n's INT attribute `name`, or dflt where it has none. */
int64_t mo_onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt);

/* Merges the MatMuls of the main graph that read one tensor and multiply
 * it by weights of the same rows (initializers of rank 2 stored as bytes,
 * read by nothing else: Q, K and V; gate and up) into one MatMul over the
 * weights concatenated along their columns and a Split giving back each
 * one's output (merge.c), where their weights hold min_elements or more
 * and `filter` (NULL: every group) takes them. *merged: the groups merged,
 * *ops: the MatMuls they had. Out of memory leaves the model half-changed:
 * free it. */
struct mo_merge_filter {
	/* whether the group whose MatMuls write outs[0..n) merges */
	bool (*take)(void *ctx, const char *const *outs, int n);
	void *ctx;
};
enum mo_status mo_onnx_merge_matmuls(struct mo_model *m, uint64_t min_elements,
				     const struct mo_merge_filter *filter, int *merged, int *ops,
				     struct mo_diag *d);
/* The inverse: a MatMul (by a weight merge_matmuls would take) whose
 * output `out` nothing reads but nodes cutting it into parts (Slices or a
 * Split of it, and what only computes their bounds: Phi-3's gate_up_proj
 * chunked into gate and up) becomes one MatMul per part over the weight's
 * columns [begin, end), writing the part's name; the cutting nodes go,
 * with what only they read. The columns are the caller's (the importer
 * folds the bounds). A cut that does not apply is left as it is; *split:
 * the cuts made. Out of memory leaves the model half-changed: free it. */
#define MO_SPLIT_MAX_PARTS 8
struct mo_split_part {
	const char *name;
	int64_t begin, end;
};
struct mo_split_cut {
	const char *out;
	int n;
	struct mo_split_part part[MO_SPLIT_MAX_PARTS];
};
enum mo_status mo_onnx_split_matmuls(struct mo_model *m, const struct mo_split_cut *cuts, int n,
				     int *split, struct mo_diag *d);
/* The tool's min_elements: 64 KiB of float32. Weights a block keeps whole
 * in shared memory (48 KiB everywhere, more on newer GPUs) need no
 * merging: the search fuses a norm with each projection apart, the weights
 * of all of them in one kernel. Past that it must loop over their rows,
 * where several MatMuls in one loop are more than it enumerates within a
 * budget. Counted in elements, so that a model partitions alike in fp16
 * and fp32. */
#define MO_MERGE_MIN_ELEMENTS ((uint64_t)16 << 10)

/* The path or name the model was loaded from. */
const char *mo_onnx_name(const struct mo_model *m);

/* The canonical folder external data is resolved against; NULL for a model
 * loaded from memory without one. */
const char *mo_onnx_dir(const struct mo_model *m);

/* The serialized size the model had when it was loaded. */
size_t mo_onnx_file_size(const struct mo_model *m);

/* The bytes of a tensor stored as raw_data or as external data (a view into
 * the model or a mapping of the external file, valid while `m` lives). Returns
 * MO_ERR_INPUT for tensors whose values are in typed fields (float_data, ...):
 * those have no byte image. */
enum mo_status mo_onnx_tensor_bytes(const struct mo_model *m,
				    const Onnx__TensorProto *t,
				    const uint8_t **data, size_t *len,
				    struct mo_diag *d);

/* Elements [start, start + cnt) of a tensor of n elements as doubles, from
 * raw, typed or external data; float32/64, float16, bfloat16, int8/32/64,
 * uint8 and bool. False for other types or data that does not match n. */
bool mo_onnx_tensor_doubles(const struct mo_model *m, const Onnx__TensorProto *t, uint64_t n,
			    uint64_t start, uint64_t cnt, double *out);

/* Size in bytes of one element of an ONNX TensorProto.DataType, 0 for types
 * without a fixed size (string) or unknown types. Sub-byte types (int4) report
 * 1 and are sized by mo_onnx_tensor_nbytes. */
size_t mo_onnx_dtype_size(int32_t data_type);
const char *mo_onnx_dtype_name(int32_t data_type);

/* Number of bytes a tensor's values occupy, wherever they are stored. */
uint64_t mo_onnx_tensor_nbytes(const struct mo_model *m,
			       const Onnx__TensorProto *t);

/* Number of external data files the model references. */
size_t mo_onnx_external_file_count(const struct mo_model *m);
/* The i-th external data file, as written in the model (relative). */
const char *mo_onnx_external_file(const struct mo_model *m, size_t i);

/* Checks the structure of the main graph and of every subgraph: the graph is
 * acyclic; every node input is a graph input, an initializer, a node output
 * or the empty (omitted optional) name, with names from enclosing graphs
 * visible in subgraphs; every name is defined once; every graph output is
 * defined. */
enum mo_status mo_onnx_validate(const struct mo_model *m, struct mo_diag *d);

/* The default-domain (ai.onnx) opset p imports; 1 when it imports none
 * (before IR version 3 there was only opset 1). */
int64_t mo_onnx_default_opset(const Onnx__ModelProto *p);

/* The newest default-domain opset the tool (and ONNX Runtime 1.30) knows;
 * validation refuses newer ones. */
#define MO_ONNX_OPSET_MAX 26
/* The newest IR version ONNX (1.23) defines. */
#define MO_ONNX_IR_MAX 14

/* Writes the model to `path` atomically: a temporary file in the same folder
 * that is renamed over `path` only once it is complete and flushed. On
 * failure nothing is left at `path` or beside it. */
enum mo_status mo_onnx_save(const struct mo_model *m, const char *path,
			    struct mo_diag *d);

/* Fails as mo_onnx_save would on `path` (missing folder, no permission, a
 * folder in the way) without writing anything: for checking before long work. */
enum mo_status mo_onnx_check_writable(const char *path, struct mo_diag *d);

/* Prints a one-screen summary: IR version, opsets, producer, nodes per op
 * type, inputs and outputs with shapes, weight bytes. */
void mo_onnx_print_summary(const struct mo_model *m, FILE *out);

#endif
