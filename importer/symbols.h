/* The importer's symbolic dimensions: every symbol the graph's inputs name,
 * bound from --dim and --input-shape, derived dims computed, contradictions
 * and unknown names refused (internal to the importer). */
#ifndef MO_SYMBOLS_H
#define MO_SYMBOLS_H

#include "mo_dimexpr.h"
#include "mo_import.h"

struct mo_symtab {
	struct mo_tp *tp;         /* holds the symbols (tp->syms) */
	struct mo_strmap index;   /* name -> index into tp->syms */
	int cap;
	const struct mo_import_options *opt; /* its readings of dim_params */
};

/* A value info's tensor shape, or NULL; a dim's dim_param as written, ""
 * for a value. */
const Onnx__TensorShapeProto *mo_symtab_shape_of(const Onnx__ValueInfoProto *v);
const char *mo_symtab_raw_param(const Onnx__TensorShapeProto__Dimension *dim);

/* A dim_param's text as the importer reads it: raw, or what the options'
 * readings make of it. */
const char *mo_symtab_param(const struct mo_symtab *st, const char *raw);

/* Collects the symbols of g's inputs, outputs and value_info into tp->syms
 * and binds them from o: --dim NAME=N binds a symbol, or a derived dim_param
 * by its whole text (which then gives the one symbol of it left unbound, or
 * must agree with the others); --input-shape binds the symbols its input's
 * dims name and must agree with the declared static dims. A name the model
 * does not have, or two values for one symbol, is MO_ERR_USAGE. */
enum mo_status mo_symtab_bind(struct mo_symtab *st, const Onnx__GraphProto *g,
			      const struct mo_import_options *o, struct mo_diag *d);

/* The value of a dim_param under the bindings. */
enum mo_dimexpr_result mo_symtab_dim(struct mo_symtab *st, const char *param, int64_t *v);

/* "batch (input_ids, attention_mask), sequence (input_ids)": the symbols of
 * the inputs that stay unbound, in the arena; NULL when none is. */
const char *mo_symtab_unbound(struct mo_symtab *st, const Onnx__GraphProto *g,
			      const struct mo_import_options *o);

void mo_symtab_free(struct mo_symtab *st);

#endif
