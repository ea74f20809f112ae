/* mirage-onnx MODEL --search-only */
#ifndef SEARCH_CMD_H
#define SEARCH_CMD_H

#include "mo_part.h"
#include "mo_search.h"

struct cli_search_args {
	const struct mo_import_options *import;
	const struct mo_part_options *part;
	const struct mo_search_options *search;
	bool json, quiet, no_cache;
	const char *dump_dir; /* --dump-mugraph: region_N.json per fused region */
};

/* Returns an exit code (0 ok, 1 bad input, 2 usage, 3 internal); d says why. */
int cli_search(const struct mo_model *m, const struct cli_search_args *a, struct mo_diag *d);

/* FNV-1a, continuing from h (start from CLI_FNV_OFFSET). */
#define CLI_FNV_OFFSET 0xcbf29ce484222325ull
uint64_t cli_fnv(uint64_t h, const void *p, size_t n);

/* The region's canonical hash (ops, parameters, operand positions, shapes,
 * dtypes, weight names, constants, outputs, search limits): the cache key. */
uint64_t cli_region_key(const struct mo_tp *tp, const struct mo_search_options *o);

/* The result cache's folder ($MIRAGE_ONNX_CACHE, else ~/.cache/mirage-onnx),
 * made if missing; false when there is none. */
bool cli_cache_dir(char *buf, size_t len);

/* --dump-mugraph: writes mg as DIR/region_LABEL.json (LABEL: "4", or "4.2" for
 * a part); a file it cannot write gets a warning, not a failure. */
void cli_dump_mugraph(const char *dir, const char *label, const struct mo_mugraph *mg);

/* The region's best μGraph: from the cache folder `cache` (NULL: none) when
 * its entry is valid for the region and passes the verdict again, else by
 * mo_search (then cached); an entry that is not gets one warning line and is
 * replaced (or removed when the search finds nothing). */
enum mo_status cli_find_mugraph(const struct mo_tp *prog, const struct mo_search_options *o,
				const char *cache, struct mo_search_result *r, bool *cached,
				struct mo_diag *d);

/* Removes the region's cache entry (its μGraph verified but its generated
 * kernel did not pass), with a warning line saying why. */
void cli_cache_drop(const struct mo_tp *prog, const struct mo_search_options *o,
		    const char *cache, const char *why);

#endif
