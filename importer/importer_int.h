/* Private to the importer. */
#ifndef IMPORTER_INT_H
#define IMPORTER_INT_H

#include "mo_tp.h"

enum mo_op mo_op_lookup(const char *domain, const char *op_type);

/* Infers dtype and shape of op's outputs from its inputs and params. Returns
 * false, with *why set, when it cannot; the op then becomes a boundary. */
bool mo_infer(struct mo_tp *tp, struct mo_tp_op *op, const Onnx__NodeProto *node,
	      const char **why);

/* The reason mo_infer gives for a shape too large to be a tensor: a corrupt
 * or hostile model, reported as an error rather than made a boundary. */
extern const char mo_why_absurd[];

/* Sets t's shape; false if the shape is absurd (negative or overflowing). */
bool mo_tensor_set_shape(struct mo_tensor *t, int rank, const int64_t *dims);

#endif
