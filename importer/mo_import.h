/* mo_import: the importer, an ONNX model's main graph as a tensor program
 * (tp/mo_tp.h): one TP op per node of the op table, shapes inferred,
 * integer shape arithmetic folded into constants, symbolic dimensions bound
 * by --dim and input shapes overridden by --input-shape. */
#ifndef MO_IMPORT_H
#define MO_IMPORT_H

#include "mo_tp.h"

#define MO_IMPORT_MAX_MORE_SIZES 3 /* --dynamic-size takes 4 sizes */
#define MO_IMPORT_MAX_BUCKETS 4    /* --dim NAME=A,B,C,D */
#define MO_IMPORT_MAX_READINGS 4

/* Binds symbolic dimensions and overrides input shapes. */
struct mo_import_options {
	int n_dims;
	const char **dim_names;
	int64_t *dim_values;
	int n_input_shapes;
	const char **input_shape_names;
	int *input_shape_ranks;
	int64_t (*input_shape_dims)[MO_MAX_RANK];
	/* --dim NAME=LO..HI: symbols left unbound within a range (lo < hi;
	 * lo == hi is a binding). The importer checks the names and that a
	 * value bound to one lies within; the fuse takes its sizes there. */
	int n_ranges;
	const char **range_names;
	int64_t (*ranges)[2];
	/* --dim NAME=A,B,...: the range 0..(the last), each value a bucket
	 * (ascending) that ops fused padded get a μGraph for (0: a plain
	 * range, its top the one bucket) */
	int *n_buckets;
	int64_t (*buckets)[MO_IMPORT_MAX_BUCKETS];
	/* not the importer's: the size the fuse gives unbound dims other than
	 * a batch when it leaves them symbolic (fuse/dynamic.c; 0: 16) */
	int64_t dynamic_size;
	/* more such sizes (--dynamic-size N,M,...): an op serving rows gets a
	 * μGraph at each too */
	int n_more_sizes;
	int64_t more_sizes[MO_IMPORT_MAX_MORE_SIZES];
	/* dim_params read as another text, wherever the graph's value infos
	 * hold them: reading_of[i] as read_as[i] (the fuse reads old
	 * Optimum's "past_sequence_length + 1" as "past_sequence_length +
	 * sequence_length" where the graph's shapes need it: fuse/dynamic.c,
	 * read_derived_dims); the texts are the caller's */
	int n_readings;
	const char *reading_of[MO_IMPORT_MAX_READINGS];
	const char *read_as[MO_IMPORT_MAX_READINGS];
	/* set by the fuse when dim_values hold sizes it chose for symbols left
	 * unbound: what holds at those sizes only (a tensor empty there) is
	 * not folded */
	bool sizes_chosen;
};

/* Parses "NAME=VALUE", "NAME=LO..HI", "NAME=A,B,..." and "NAME=2x4096"
 * flag values into options (the names are copied). */
enum mo_status mo_tp_add_dim(struct mo_import_options *o, const char *arg,
			     struct mo_diag *d);
enum mo_status mo_tp_add_input_shape(struct mo_import_options *o, const char *arg,
				     struct mo_diag *d);
void mo_import_options_free(struct mo_import_options *o);

/* The range --dim gave symbol `name`: true with lo/hi set, else false. */
bool mo_import_range(const struct mo_import_options *o, const char *name, int64_t *lo,
		     int64_t *hi);
/* The buckets --dim NAME=A,B,... gave symbol `name`, ascending, into
 * b[MO_IMPORT_MAX_BUCKETS]: how many (0 without a list). */
int mo_import_buckets(const struct mo_import_options *o, const char *name, int64_t *b);

/* Derived dims of the inputs that the graph contradicts, read as it needs
 * them (importer/readings.c): old Optimum's "past_sequence_length + 1" as
 * "past_sequence_length + sequence_length". */
struct mo_import_readings {
	int n;
	char reading_of[MO_IMPORT_MAX_READINGS][128];
	char read_as[MO_IMPORT_MAX_READINGS][260];
	char said[900]; /* what was read how, and why; "" when nothing */
};

/* Finds r's readings of m's dims under o (imports m a few times, only when
 * an input has a dim S + c); MO_OK with r->n 0 when there are none. */
enum mo_status mo_import_readings(const struct mo_model *m, const struct mo_import_options *o,
				  struct mo_import_readings *r, struct mo_diag *d);

enum mo_status mo_tp_import(const struct mo_model *m,
			    const struct mo_import_options *opt,
			    struct mo_tp **out, struct mo_diag *d);

#endif
