/* mirage-onnx MODEL --search-only */
#ifndef SEARCH_CMD_H
#define SEARCH_CMD_H

#include "mo_import.h"
#include "mo_part.h"
#include "mo_search.h"

struct cli_search_args {
	const struct mo_import_options *import;
	const struct mo_part_options *part;
	const struct mo_search_options *search;
	bool json, quiet, no_cache;
	const char *dump_dir; /* --dump-mugraph: region_N.json per fused region */
};

/* Prints each region's best μGraph; d says why it failed. */
enum mo_status cli_search(const struct mo_model *m, const struct cli_search_args *a,
			  struct mo_diag *d);

#endif
