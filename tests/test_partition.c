/* The partitioner on random programs: whatever the graph, every region is
 * convex, collapsing all regions leaves the graph acyclic, and no region
 * breaks a limit (ops, exps on a path, MatMuls chained on a path). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mo_part.h"

static uint64_t rng_state;

static uint32_t rnd(uint32_t n)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state % n);
}

/* Ops drawn from every class, boundaries included. */
static const enum mo_op kinds[] = {
	MO_OP_MATMUL, MO_OP_ADD, MO_OP_MUL, MO_OP_DIV, MO_OP_EXP, MO_OP_SIGMOID,
	MO_OP_SOFTMAX, MO_OP_REDUCE_SUM, MO_OP_SQRT, MO_OP_TRANSPOSE, MO_OP_RESHAPE,
	MO_OP_RELU, MO_OP_OPAQUE, MO_OP_GATHER, MO_OP_CAST, MO_OP_IDENTITY,
};

/* A random DAG of n ops over [4, 4] float tensors: each op reads one or two
 * earlier tensors (or graph inputs), so the graph has diamonds, long skips
 * and ops with many consumers. */
static struct mo_tp *random_tp(int n)
{
	struct mo_tp *tp = calloc(1, sizeof *tp);
	mo_arena_init(&tp->arena);
	int n_inputs = 1 + (int)rnd(3);
	tp->n_tensors = n_inputs + n;
	tp->n_ops = n;
	tp->n_nodes = n;
	tp->tensors = mo_arena_array(&tp->arena, (size_t)tp->n_tensors, sizeof *tp->tensors);
	tp->ops = mo_arena_array(&tp->arena, (size_t)n, sizeof *tp->ops);
	tp->node_op = mo_arena_array(&tp->arena, (size_t)n, sizeof *tp->node_op);
	tp->node_names = mo_arena_array(&tp->arena, (size_t)n, sizeof *tp->node_names);
	int *cons_count = calloc((size_t)tp->n_tensors, sizeof(int));
	for (int t = 0; t < tp->n_tensors; t++) {
		struct mo_tensor *x = &tp->tensors[t];
		x->name = mo_arena_printf(&tp->arena, "t%d", t);
		x->kind = t < n_inputs ? MO_T_INPUT : MO_T_VALUE;
		x->dtype = 1;
		x->shape_known = true;
		x->rank = 2;
		x->dims[0] = x->dims[1] = 4;
		x->producer = t < n_inputs ? -1 : t - n_inputs;
		x->source_node = x->producer;
	}
	for (int v = 0; v < n; v++) {
		struct mo_tp_op *op = &tp->ops[v];
		op->kind = kinds[rnd(sizeof kinds / sizeof *kinds)];
		op->lax = mo_op_table[op->kind].lax;
		op->exps = mo_op_table[op->kind].exps;
		op->node = v;
		op->n_in = op->kind == MO_OP_MATMUL || op->kind == MO_OP_ADD ||
				   op->kind == MO_OP_MUL || op->kind == MO_OP_DIV ? 2 : 1;
		op->in = mo_arena_array(&tp->arena, 2, sizeof(int));
		op->out = mo_arena_array(&tp->arena, 1, sizeof(int));
		for (int k = 0; k < op->n_in; k++) {
			/* mostly recent tensors, sometimes far back */
			int avail = n_inputs + v;
			int t = rnd(4) ? avail - 1 - (int)rnd(avail < 4 ? avail : 4) : (int)rnd(avail);
			op->in[k] = t;
			cons_count[t]++;
		}
		op->n_out = 1;
		op->out[0] = n_inputs + v;
		tp->node_op[v] = v;
		tp->node_names[v] = mo_arena_printf(&tp->arena, "n%d", v);
	}
	for (int t = 0; t < tp->n_tensors; t++)
		tp->tensors[t].consumers = mo_arena_array(&tp->arena, (size_t)cons_count[t] + 1,
							  sizeof(int));
	for (int v = 0; v < n; v++)
		for (int k = 0; k < tp->ops[v].n_in; k++) {
			struct mo_tensor *x = &tp->tensors[tp->ops[v].in[k]];
			if (!x->n_consumers || x->consumers[x->n_consumers - 1] != v)
				x->consumers[x->n_consumers++] = v;
		}
	tp->tensors[tp->n_tensors - 1].is_graph_output = true;
	free(cons_count);
	assert_false(tp->arena.failed);
	return tp;
}

static void free_tp(struct mo_tp *tp)
{
	mo_arena_free(&tp->arena);
	free(tp);
}

/* Longest path in exps and in MatMuls, inside one region, by brute force. */
static void region_paths(const struct mo_tp *tp, const struct mo_partition *p, int ri,
			 int *max_e, int *max_mm)
{
	int n = tp->n_ops;
	int *e = calloc((size_t)n, sizeof(int)), *mm = calloc((size_t)n, sizeof(int));
	*max_e = *max_mm = 0;
	for (int v = 0; v < n; v++) {
		if (p->op_region[v] != ri)
			continue;
		const struct mo_tp_op *op = &tp->ops[v];
		int be = 0, bm = 0;
		for (int k = 0; k < op->n_in; k++) {
			int u = tp->tensors[op->in[k]].producer;
			if (u >= 0 && p->op_region[u] == ri) {
				be = e[u] > be ? e[u] : be;
				bm = mm[u] > bm ? mm[u] : bm;
			}
		}
		e[v] = be + op->exps;
		mm[v] = bm + (op->kind == MO_OP_MATMUL);
		*max_e = e[v] > *max_e ? e[v] : *max_e;
		*max_mm = mm[v] > *max_mm ? mm[v] : *max_mm;
	}
	free(e);
	free(mm);
}

/* Is region ri convex? No path from a member through a non-member back to a
 * member (checked independently of mo_part_check). */
static bool convex(const struct mo_tp *tp, const struct mo_partition *p, int ri)
{
	int n = tp->n_ops;
	/* outside[v]: v is outside and reachable from the region via outside ops */
	bool *outside = calloc((size_t)n, sizeof(bool));
	bool ok = true;
	for (int v = 0; v < n && ok; v++) {
		const struct mo_tp_op *op = &tp->ops[v];
		bool from_region = false, from_outside = false;
		for (int k = 0; k < op->n_in; k++) {
			int u = tp->tensors[op->in[k]].producer;
			if (u < 0)
				continue;
			from_region |= p->op_region[u] == ri;
			from_outside |= outside[u];
		}
		if (p->op_region[v] == ri)
			ok = !from_outside;
		else
			outside[v] = from_region || from_outside;
	}
	free(outside);
	return ok;
}

static void random_dags_partition_soundly(void **state)
{
	(void)state;
	rng_state = 0x9e3779b97f4a7c15ull;
	int regions = 0, multi = 0;
	for (int trial = 0; trial < 400; trial++) {
		int n = 2 + (int)rnd(60);
		struct mo_tp *tp = random_tp(n);
		struct mo_part_options opt = MO_PART_DEFAULTS;
		opt.max_ops = 2 + (int)rnd(20);
		struct mo_partition *p;
		struct mo_diag d;
		mo_diag_init(&d);
		assert_int_equal(mo_part_run(tp, &opt, &p, &d), MO_OK);
		char why[200];
		if (!mo_part_check(tp, p, why, sizeof why))
			fail_msg("trial %d: %s", trial, why);
		for (int ri = 0; ri < p->n_regions; ri++) {
			const struct mo_region *r = &p->regions[ri];
			int e, mm;
			region_paths(tp, p, ri, &e, &mm);
			assert_true(r->n_ops >= 2 && r->n_ops <= opt.max_ops);
			assert_true(e <= 1 && e == r->exps);
			assert_true(mm <= 2 && mm == r->matmul_chain);
			if (!convex(tp, p, ri))
				fail_msg("trial %d: region %d is not convex", trial, ri + 1);
			for (int i = 0; i < r->n_ops; i++)
				assert_int_not_equal(tp->ops[r->ops[i]].lax, MO_LAX_NONE);
			multi += r->n_ops > 2;
		}
		regions += p->n_regions;
		mo_part_free(p);
		free_tp(tp);
	}
	/* the generator must actually produce fusable structure */
	assert_true(regions > 400);
	assert_true(multi > 100);
}

/* A copy at a region's entry (a Cast to the dtype it has) that an op
 * outside the region reads too stays out of the region, which reads the
 * copy; read only inside, it stays in. */
static void entry_copy_read_outside_stays_out(void **state)
{
	(void)state;
	for (int outside = 0; outside <= 1; outside++) {
		rng_state = 42;
		struct mo_tp *tp = random_tp(4);
		/* t1 = Cast(t0); t2 = t1 * t1; t3 = Sqrt(t2); t4 = Opaque(t1 or t3) */
		static const enum mo_op k[4] = { MO_OP_CAST, MO_OP_MUL, MO_OP_SQRT, MO_OP_OPAQUE };
		int n_in = tp->n_tensors - 4;
		for (int v = 0; v < 4; v++) {
			struct mo_tp_op *op = &tp->ops[v];
			op->kind = k[v];
			op->lax = mo_op_table[k[v]].lax;
			op->exps = 0;
			op->n_in = v == 1 ? 2 : 1;
			op->in[0] = v == 0 ? 0 : v == 3 && outside ? n_in : n_in + v - 1;
			op->in[1] = n_in;
		}
		tp->tensors[n_in + 2].is_graph_output = true;
		struct mo_part_options opt = MO_PART_DEFAULTS;
		struct mo_partition *p;
		struct mo_diag d;
		mo_diag_init(&d);
		assert_int_equal(mo_part_run(tp, &opt, &p, &d), MO_OK);
		assert_int_equal(p->n_regions, 1);
		assert_int_equal(p->regions[0].n_ops, outside ? 2 : 3);
		assert_int_equal(p->op_region[0], outside ? -1 : 0);
		char why[200];
		if (!mo_part_check(tp, p, why, sizeof why))
			fail_msg("%s", why);
		mo_part_free(p);
		free_tp(tp);
	}
}

/* mo_part_check itself must catch a region that is not convex. */
static void the_checker_catches_a_broken_partition(void **state)
{
	(void)state;
	rng_state = 42;
	struct mo_tp *tp = random_tp(3);
	/* a -> b -> c, with a and c in one region and b outside */
	for (int v = 0; v < 3; v++) {
		tp->ops[v].kind = MO_OP_ADD;
		tp->ops[v].lax = MO_LAX_MULTILINEAR;
		tp->ops[v].n_in = 1;
		tp->ops[v].in[0] = v == 0 ? 0 : tp->ops[v - 1].out[0];
	}
	struct mo_partition p = { 0 };
	int op_region[3] = { 0, -1, 0 };
	struct mo_region r = { .n_ops = 2, .ops = (int[]){ 0, 2 } };
	p.n_regions = 1;
	p.regions = &r;
	p.op_region = op_region;
	char why[200];
	assert_false(mo_part_check(tp, &p, why, sizeof why));
	op_region[1] = 0;
	r.n_ops = 3;
	r.ops = (int[]){ 0, 1, 2 };
	assert_true(mo_part_check(tp, &p, why, sizeof why));
	free_tp(tp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(random_dags_partition_soundly),
		cmocka_unit_test(the_checker_catches_a_broken_partition),
		cmocka_unit_test(entry_copy_read_outside_stays_out),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
