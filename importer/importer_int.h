/* Private to the importer. */
#ifndef IMPORTER_INT_H
#define IMPORTER_INT_H

#include "mo_tp.h"


/* The reason mo_infer gives for a shape too large to be a tensor: a corrupt
 * or hostile model, reported as an error rather than made a boundary. */
extern const char mo_why_absurd[];

/* The output of op (its inputs' shapes known) is their numpy broadcast, of
 * dtype; false with *why when they do not broadcast. */
bool mo_tp_broadcast(struct mo_tp *tp, struct mo_tp_op *op, int32_t dtype, const char **why);


#endif
