/* mirage-onnx MODEL -o OUT: the fuse pipeline (fuse/mo_fuse.h), printed. */
#ifndef FUSE_CMD_H
#define FUSE_CMD_H

#include "mo_fuse.h"

/* A warning line of a stage (the search's cache and safety net, the fuse
 * pipeline) on stderr, as every warning of the tool is said. */
void cli_warning_line(void *ctx, const char *line);

/* How MatMuls that share their input are merged (mo_onnx_merge_matmuls):
 * where that fuses more (the default), always (--merge-matmuls: m comes
 * merged), never (--no-merge-matmuls). */
enum cli_merge { CLI_MERGE_AUTO, CLI_MERGE_ALWAYS, CLI_MERGE_NEVER };

/* Runs it, printing progress (unless quiet) and warnings to stderr, the
 * region table and what was written to stdout; d says why it failed.
 * CLI_MERGE_AUTO: mo_fuse_search_merging (the merged form searched too
 * where MatMuls that may merge lie in regions not fused whole, the one
 * that fuses more built). merged: m's MatMuls were merged before, so
 * that with nothing fused OUT is written again from the model file as it
 * was. */
enum mo_status cli_fuse(struct mo_model *m, struct mo_fuse_options *o, bool quiet,
			enum cli_merge merge, bool merged, struct mo_diag *d);

#endif
