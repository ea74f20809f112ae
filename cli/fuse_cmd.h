/* mirage-onnx MODEL -o OUT: partition, search, generate, compile, check,
 * export. */
#ifndef FUSE_CMD_H
#define FUSE_CMD_H

#include "mo_part.h"
#include "mo_search.h"

struct cli_fuse_args {
	const char *in_path, *out_path;
	const struct mo_import_options *import;
	const struct mo_part_options *part;
	const struct mo_search_options *search;
	bool quiet, no_cache;
	bool cuda;                /* CUDA kernels too (nvcc found, not --no-cuda) */
	const char *archs;        /* "80,90" */
	const char *keep_sources; /* --keep-sources DIR, or NULL */
	const char *dump_dir;     /* --dump-mugraph DIR, or NULL */
	const char *banner;       /* the first line of every generated file */
	bool cpu_kernels;         /* the plugin registers its CPU kernels by default */
	/* --profile: time each region's best μGraph and its runners-up (the
	 * search's options.alternatives) on the GPU and keep the fastest */
	bool profile;
};
/* μGraphs --profile times per region: the best and its runners-up */
#define CLI_PROFILE_CANDIDATES 3

/* Returns an exit code (0 ok, 1 bad input, 2 usage, 3 internal); d says why.
 * Edits m (the export rewrites its graph). */
int cli_fuse(struct mo_model *m, const struct cli_fuse_args *a, struct mo_diag *d);

/* OUT's companion file: "m.onnx" -> "m" + suffix (".mirage.<build>.so", ...). */
void cli_beside(const char *out, const char *suffix, char *buf, size_t len);

#endif
