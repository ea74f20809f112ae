/* Builds small ONNX models in memory for the unit tests. Everything a builder
 * allocates is released by tm_free. */
#ifndef TMODEL_H
#define TMODEL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "onnx.pb-c.h"

struct tmodel {
	Onnx__ModelProto model;
	Onnx__GraphProto graph;
	Onnx__OperatorSetIdProto opset;
	Onnx__OperatorSetIdProto *opsets[1];
	void **allocs;
	size_t n_allocs;
};

void tm_init(struct tmodel *t);
void tm_free(struct tmodel *t);
/* Adds a float32 graph input/output of the given shape to a graph. */
void tm_input(struct tmodel *t, Onnx__GraphProto *g, const char *name, size_t rank, const int64_t *dims);
void tm_output(struct tmodel *t, Onnx__GraphProto *g, const char *name);
/* Adds a node; inputs and outputs are NULL-terminated lists. */
Onnx__NodeProto *tm_node(struct tmodel *t, Onnx__GraphProto *g, const char *op,
			 const char *name, const char *const *inputs,
			 const char *const *outputs);
/* Adds a float32 initializer with raw data (n floats). */
Onnx__TensorProto *tm_initializer(struct tmodel *t, Onnx__GraphProto *g, const char *name,
				  size_t rank, const int64_t *dims, const float *data, size_t n);
/* Adds a float32 initializer stored as external data. offset/length < 0: absent. */
Onnx__TensorProto *tm_external(struct tmodel *t, Onnx__GraphProto *g, const char *name,
			       size_t rank, const int64_t *dims, const char *location,
			       long long offset, long long length);
/* A new empty graph for a subgraph attribute of `node`. */
Onnx__GraphProto *tm_subgraph(struct tmodel *t, Onnx__NodeProto *node, const char *attr);
/* Serializes; the buffer is owned by t. */
uint8_t *tm_pack(struct tmodel *t, size_t *len);
/* Appends p to a protobuf-c repeated pointer field (arr, its count n), the
 * grown array allocated by t. */
#define TM_APPEND(t, arr, n, p)                                               \
	do {                                                                  \
		void *old_ = (arr);                                           \
		(arr) = tm_alloc((t), ((n) + 1) * sizeof *(arr));             \
		if (n)                                                        \
			memcpy((arr), old_, (n) * sizeof *(arr));             \
		(arr)[(n)++] = (p);                                           \
	} while (0)

/* A copy of s allocated by t. */
char *tm_strdup(struct tmodel *t, const char *s);

/* A new empty folder under /tmp (malloc'd name; aborts on failure), and its
 * removal with everything in it. */
char *tm_tmpdir(void);
void tm_rm_rf(const char *dir);
/* A whole file, malloc'd (free it), its size in *len; aborts if it cannot be
 * read. */
uint8_t *tm_read_file(const char *path, size_t *len);
/* Entries in a folder, "." and ".." not counted; aborts if it cannot be read. */
size_t tm_count_entries(const char *dir);

/* Allocation tracked by t. */
void *tm_alloc(struct tmodel *t, size_t n);

#endif
