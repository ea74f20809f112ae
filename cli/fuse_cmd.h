/* mirage-onnx MODEL -o OUT: the fuse pipeline (fuse/mo_fuse.h), printed. */
#ifndef FUSE_CMD_H
#define FUSE_CMD_H

#include "mo_fuse.h"

/* Runs it, printing progress (unless quiet) and warnings to stderr, the
 * region table and what was written to stdout; d says why it failed. */
enum mo_status cli_fuse(struct mo_model *m, struct mo_fuse_options *o, bool quiet,
			struct mo_diag *d);

#endif
