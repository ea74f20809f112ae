/* Private to mugraph/: what the builders (mugraph.c) and the memory plan
 * (plan.c) share. */
#ifndef MUGRAPH_INT_H
#define MUGRAPH_INT_H

#include "mo_mugraph.h"

/* fp16 or bf16: stored in 2 bytes, in shared memory as between kernels. */
bool mo_mg_two_byte(int32_t dt);

/* mo_bg_usage of bg under a plan already made (p: mo_bg_plan's). */
void mo_bg_usage_of_plan(const struct mo_block_graph *bg, const struct mo_bg_plan *p,
			 struct mo_bg_usage *u);

#endif
