/* The memory plan of a block graph (paper §6): where each tile lives in
 * shared memory, single- and double-buffered, which thread graphs use
 * tensor cores, and what a kernel asks of a GPU (shared memory, registers,
 * threads) against the targets' limits. */
#include "mugraph_int.h"

#include <stdlib.h>
#include <string.h>

/* ---- the targets' limits ---- */

uint64_t mo_target_smem(enum mo_target t)
{
	return mo_arch_smem(t == MO_SM90 ? 90 : 80);
}

uint64_t mo_arch_smem(int sm)
{
	switch (sm) {
	case 75: return 64u * 1024;
	case 80: return 163u * 1024;
	case 86: case 89: return 99u * 1024;
	case 90: return 227u * 1024;
	default: return 0;
	}
}

static int add_gpu(int sm, int *sms, uint64_t *lim, int n, int max)
{
	for (int i = 0; i < n; i++)
		if (sms[i] == sm)
			return n;
	if (n == max)
		return n;
	int i = n++;
	for (; i > 0 && lim[i - 1] < mo_arch_smem(sm); i--) { /* largest first, stable */
		lim[i] = lim[i - 1];
		sms[i] = sms[i - 1];
	}
	sms[i] = sm;
	lim[i] = mo_arch_smem(sm);
	return n;
}

int mo_arch_gpus(const char *archs, int *sm, uint64_t *lim, int max)
{
	int n = 0;
	bool has80 = false, has8x = false;
	for (const char *p = archs; p && *p;) {
		char *end;
		long v = strtol(p, &end, 10);
		if (end == p)
			break;
		if (v > 0 && v < 1000 && mo_arch_smem((int)v)) {
			n = add_gpu((int)v, sm, lim, n, max);
			has80 |= v == 80;
			has8x |= v == 86 || v == 89;
		}
		p = *end ? end + 1 : end;
	}
	if (has80 && !has8x)
		n = add_gpu(86, sm, lim, n, max);
	return n;
}

int mo_target_regs_per_thread(enum mo_target t)
{
	(void)t;
	return 255;
}

int mo_target_regs_per_sm(enum mo_target t)
{
	(void)t;
	return 65536;
}

/* ---- the memory plan (paper §6) ---- */

/* post[i]: body tensor i exists only after the for-loop (it depends on an
 * accumulator). */
static void phases(const struct mo_block_graph *bg, bool *post)
{
	for (int i = 0; i < bg->body.n_tensors; i++)
		post[i] = false;
	for (int a = 0; a < bg->n_accums; a++)
		post[bg->accums[a].out] = true;
	for (int i = 0; i < bg->body.n_ops; i++) {
		const struct mo_tp_op *op = &bg->body.ops[i];
		bool p = false;
		for (int k = 0; k < op->n_in; k++)
			p |= op->in[k] >= 0 && post[op->in[k]];
		post[op->out[0]] = p;
	}
}

/* A thread graph runs as one loop when each of its ops makes a tile of one
 * shape, in one phase, and reads the run's own tiles without broadcasting:
 * each thread then owns the same elements of all of them. Its tiles read
 * nowhere else (no other op, accumulator or saver) stay in registers. */
static void register_thread_graphs(const struct mo_block_graph *bg, struct mo_bg_plan *p)
{
	const struct mo_tp *body = &bg->body;
	for (int k = 0; k < bg->n_tgs; k++) {
		int first = bg->tgs[k].first, last = bg->tgs[k].last;
		if (first < 0 || last >= body->n_ops || first > last)
			continue;
		const struct mo_tensor *shape = &body->tensors[body->ops[first].out[0]];
		bool phase = p->post[body->ops[first].out[0]], ok = true;
		for (int j = first; j <= last && ok; j++) {
			const struct mo_tp_op *op = &body->ops[j];
			ok = mo_op_elementwise(op->kind) && op->n_out == 1 && op->n_in <= 2 &&
			     mo_same_shape(&body->tensors[op->out[0]], shape) &&
			     p->post[op->out[0]] == phase;
			for (int q = 0; ok && q < op->n_in; q++) {
				int t = op->in[q];
				int prod = t >= 0 ? body->tensors[t].producer : -1;
				if (prod >= first && prod < j)
					ok = mo_same_shape(&body->tensors[t], shape);
			}
		}
		if (!ok)
			continue;
		p->tg_last[first] = last;
		for (int j = first; j <= last; j++) {
			int t = body->ops[j].out[0];
			bool outside = false;
			for (int o = 0; o < body->n_ops && !outside; o++)
				for (int q = 0; (o < first || o > last) && q < body->ops[o].n_in; q++)
					outside |= body->ops[o].in[q] == t;
			for (int a = 0; a < bg->n_accums; a++)
				outside |= bg->accums[a].in == t || bg->accums[a].max_in == t;
			for (int v = 0; v < bg->n_savers; v++)
				outside |= bg->savers[v].tile == t;
			p->in_reg[t] = !outside;
		}
	}
}

/* Scheduling by depth (paper §6): a unit (a block op, or a register thread
 * graph) goes after every unit it reads from, as early as it can, so the
 * units of one depth run between the same two barriers. In the for-loop a
 * tile's depth counts from the iterators; after it, from the accumulators.
 * Ties keep the body's order. */
static void schedule_by_depth(const struct mo_block_graph *bg, struct mo_bg_plan *p,
			      int *unit_depth)
{
	const struct mo_tp *body = &bg->body;
	int depth_of_tile[MO_MG_MAX] = { 0 };
	p->n_order = 0;
	for (int i = 0; i < body->n_ops; i++) {
		int last = p->tg_last[i] >= 0 ? p->tg_last[i] : i, d = 0;
		for (int j = i; j <= last; j++)
			for (int k = 0; k < body->ops[j].n_in; k++) {
				int t = body->ops[j].in[k];
				int pr = t >= 0 ? body->tensors[t].producer : -1;
				if (pr >= 0 && (pr < i || pr > last) &&
				    p->post[t] == p->post[body->ops[i].out[0]])
					d = depth_of_tile[t] > d ? depth_of_tile[t] : d;
			}
		for (int j = i; j <= last; j++)
			depth_of_tile[body->ops[j].out[0]] = d + 1;
		unit_depth[p->n_order] = d + 1 + (p->post[body->ops[i].out[0]] ? 2 * MO_MG_MAX : 0);
		p->order[p->n_order++] = i;
		i = last;
	}
	/* stable insertion sort by (phase, depth) */
	for (int a = 1; a < p->n_order; a++)
		for (int b = a; b > 0 && unit_depth[b] < unit_depth[b - 1]; b--) {
			int t = unit_depth[b];
			unit_depth[b] = unit_depth[b - 1];
			unit_depth[b - 1] = t;
			t = p->order[b];
			p->order[b] = p->order[b - 1];
			p->order[b - 1] = t;
		}
}

/* A buffer's life in steps of the schedule (see struct mo_bg_plan). */
struct life {
	uint64_t bytes;
	int from, to;
	uint64_t *off;
};

static int cmp_life(const void *a, const void *b)
{
	const struct life *x = a, *y = b;
	if (x->from != y->from)
		return x->from < y->from ? -1 : 1;
	return x->bytes > y->bytes ? -1 : x->bytes < y->bytes;
}

bool mo_mg_two_byte(int32_t dt)
{
	return dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
}

static uint64_t align32(uint64_t n)
{
	return (n + 31) & ~(uint64_t)31; /* tensor-core fragments need 32 bytes */
}

static void plan(const struct mo_block_graph *bg, bool pipelined, struct mo_bg_plan *p)
{
	const struct mo_tp *body = &bg->body;
	memset(p, 0, sizeof *p);
	for (int i = 0; i < MO_MG_MAX; i++)
		p->tg_last[i] = -1;
	phases(bg, p->post);
	register_thread_graphs(bg, p);
	/* steps: the iterators (0); the loop's units, one step per depth (1..);
	 * the accumulators; the units after the loop, one step per depth; the
	 * savers. A tile's bytes stay its own until the end of the step of its
	 * last reader, so bytes change hands only where a barrier already
	 * stands: before the first unit of a depth, which reads what the
	 * previous depth wrote. */
	int unit_depth[MO_MG_MAX], loop_depth = 0, post_depth = 0, step_op[MO_MG_MAX];
	schedule_by_depth(bg, p, unit_depth);
	for (int u = 0; u < p->n_order; u++) {
		if (unit_depth[u] > 2 * MO_MG_MAX)
			post_depth = unit_depth[u] - 2 * MO_MG_MAX;
		else
			loop_depth = unit_depth[u];
	}
	int accums = loop_depth + 1, loop_end = accums, savers = accums + post_depth + 1;
	for (int u = 0; u < p->n_order; u++) {
		int i = p->order[u], last = p->tg_last[i] >= 0 ? p->tg_last[i] : i;
		int st = unit_depth[u] > 2 * MO_MG_MAX ? accums + unit_depth[u] - 2 * MO_MG_MAX : unit_depth[u];
		for (int j = i; j <= last; j++)
			step_op[j] = st;
	}
	int from[MO_MG_MAX], to[MO_MG_MAX];
	for (int t = 0; t < body->n_tensors; t++)
		from[t] = to[t] = -1;
	p->pipelined = pipelined;
	for (int i = 0; i < bg->n_iters; i++) {
		int t = bg->iters[i].tile;
		from[t] = 0;
		if (pipelined)
			to[t] = loop_end; /* the next iteration's half fills meanwhile */
	}
	for (int i = 0; i < body->n_ops; i++) {
		const struct mo_tp_op *op = &body->ops[i];
		from[op->out[0]] = step_op[i];
		for (int k = 0; k < op->n_in; k++)
			if (op->in[k] >= 0 && to[op->in[k]] < step_op[i])
				to[op->in[k]] = step_op[i];
	}
	for (int a = 0; a < bg->n_accums; a++) {
		const struct mo_bg_accum *x = &bg->accums[a];
		from[x->out] = 0; /* read and written by every iteration */
		if (to[x->out] < loop_end)
			to[x->out] = loop_end;
		to[x->in] = to[x->in] > accums ? to[x->in] : accums;
		if (x->max_in >= 0 && to[x->max_in] < accums)
			to[x->max_in] = accums;
	}
	for (int t = 0; t < body->n_tensors; t++)
		from[t] = from[t] < 0 ? 0 : from[t];
	for (int s = 0; s < bg->n_savers; s++)
		if (to[bg->savers[s].tile] < savers)
			to[bg->savers[s].tile] = savers;
	struct life L[3 * MO_MG_MAX];
	int n = 0;
	for (int t = 0; t < body->n_tensors; t++) {
		const struct mo_tensor *x = &body->tensors[t];
		if (x->kind == MO_T_CONST || p->in_reg[t])
			continue;
		int32_t dt = x->kind == MO_T_INPUT ? x->dtype : ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
		p->elem[t] = mo_mg_two_byte(dt) ? 2 : 4;
		uint64_t bytes = align32(mo_tensor_numel(x) * p->elem[t]);
		if (pipelined && x->kind == MO_T_INPUT)
			bytes *= 2; /* two halves: off and off2 */
		L[n++] = (struct life){ bytes, from[t], to[t] > from[t] ? to[t] : from[t], &p->off[t] };
	}
	for (int a = 0; a < bg->n_accums; a++) {
		const struct mo_bg_accum *x = &bg->accums[a];
		if (x->kind != MO_ACC_RESCALED)
			continue;
		uint64_t bytes = mo_tensor_numel(&body->tensors[x->max_in]) * 4;
		L[n++] = (struct life){ bytes, 0, loop_end, &p->off_run[a] };
		L[n++] = (struct life){ bytes, 0, loop_end, &p->off_new[a] };
	}
	for (int i = 0; i < n; i++)
		L[i].bytes = align32(L[i].bytes);
	qsort(L, (size_t)n, sizeof *L, cmp_life);
	/* first fit: the lowest offset clear of every placed buffer alive at
	 * the same time */
	for (int i = 0; i < n; i++) {
		uint64_t at = 0;
		for (bool moved = true; moved;) {
			moved = false;
			for (int j = 0; j < i; j++)
				if (L[j].from <= L[i].to && L[i].from <= L[j].to &&
				    *L[j].off < at + L[i].bytes && at < *L[j].off + L[j].bytes) {
					at = *L[j].off + L[j].bytes;
					moved = true;
				}
		}
		*L[i].off = at;
		p->bytes = at + L[i].bytes > p->bytes ? at + L[i].bytes : p->bytes;
		p->bytes_unshared += L[i].bytes;
	}
	bool stage = false;
	for (int i = 0; i < body->n_ops; i++) {
		struct mo_bg_mma m;
		if (mo_bg_mma(bg, p, i, &m))
			stage |= m.stage[0] || m.stage[1];
	}
	if (stage) { /* every warp's slice, for the whole kernel */
		p->off_stage = align32(p->bytes);
		p->bytes = p->off_stage + (uint64_t)MO_MMA_STAGE_BYTES * (MO_BLOCK_THREADS / 32);
		p->bytes_unshared += (uint64_t)MO_MMA_STAGE_BYTES * (MO_BLOCK_THREADS / 32);
	}
	for (int i = 0; i < bg->n_iters; i++) {
		int t = bg->iters[i].tile;
		p->off2[t] = p->off[t];
		if (pipelined)
			p->off2[t] += align32(mo_tensor_numel(&body->tensors[t]) * p->elem[t]);
	}
}

void mo_bg_plan(const struct mo_block_graph *bg, struct mo_bg_plan *p)
{
	plan(bg, false, p);
}

bool mo_bg_mma(const struct mo_block_graph *bg, const struct mo_bg_plan *p, int i,
	       struct mo_bg_mma *m)
{
	const struct mo_tp *body = &bg->body;
	const struct mo_tp_op *op = &body->ops[i];
	memset(m, 0, sizeof *m);
	if (op->kind != MO_OP_MATMUL || op->n_in != 2 || op->in[0] < 0 || op->in[1] < 0)
		return false;
	const struct mo_tensor *A = &body->tensors[op->in[0]], *B = &body->tensors[op->in[1]];
	int tb = m->trans_b = op->p.trans_b != 0;
	const struct mo_tensor *Y = &body->tensors[op->out[0]];
	if (A->rank < 2 || B->rank < 2 || Y->rank < 2 || p->elem[op->out[0]] != 4)
		return false;
	/* the storage type: the operands' 2-byte type, else the kernel's */
	for (int k = 0; k < 2; k++) {
		int t = op->in[k];
		if (p->elem[t] == 0)
			return false; /* a constant or a register tile */
		if (p->elem[t] == 2) {
			if (m->dtype && m->dtype != body->tensors[t].dtype)
				return false;
			m->dtype = body->tensors[t].dtype;
		}
		m->stage[k] = p->elem[t] == 4;
	}
	for (int k = 0; k < bg->n_iters && !m->dtype; k++) {
		const struct mo_tensor *t = &body->tensors[bg->iters[k].tile];
		if (mo_mg_two_byte(t->dtype))
			m->dtype = t->dtype;
	}
	if (!mo_mg_two_byte(m->dtype))
		return false;
	int64_t M = Y->dims[Y->rank - 2], N = Y->dims[Y->rank - 1], K = A->dims[A->rank - 1];
	if (K % 16 || N % 16 || M % 8 || A->dims[A->rank - 2] != M ||
	    B->dims[B->rank - 2 + tb] != K || B->dims[B->rank - 1 - tb] != N)
		return false;
	/* batch dims: each operand's equal to the output's or all 1 */
	for (int k = 0; k < 2; k++) {
		const struct mo_tensor *X = k ? B : A;
		bool whole = X->rank <= 2 || X->rank == Y->rank;
		for (int d = 0; d + 2 < X->rank && whole; d++)
			whole = X->dims[d] == 1 || X->dims[d] == Y->dims[d + Y->rank - X->rank];
		if (!whole)
			return false;
	}
	m->fm = M % 16 == 0 ? 16 : 8;
	m->fn = m->fm == 16 ? 16 : 32;
	return N % m->fn == 0;
}

bool mo_bg_plan_pipelined(const struct mo_block_graph *bg, uint64_t smem_limit,
			  struct mo_bg_plan *p)
{
	if (bg->forloop > 1 && bg->n_iters > 0) {
		plan(bg, true, p);
		if (p->bytes <= smem_limit)
			return true;
	}
	plan(bg, false, p);
	return false;
}

void mo_bg_plan_bytes(const struct mo_block_graph *bg, uint64_t *single, uint64_t *dbuf)
{
	struct mo_bg_plan p;
	plan(bg, false, &p);
	*single = p.bytes;
	*dbuf = 0;
	if (bg->forloop > 1 && bg->n_iters > 0) {
		plan(bg, true, &p);
		*dbuf = p.bytes;
	}
}

uint64_t mo_mg_smem(const struct mo_mugraph *mg)
{
	uint64_t most = 0;
	for (int k = 0; k < mg->n_ops; k++) {
		if (!mg->ops[k].bg)
			continue;
		uint64_t single, dbuf;
		mo_bg_plan_bytes(mg->ops[k].bg, &single, &dbuf);
		most = single > most ? single : most;
	}
	return most;
}

/* What the block graph planned as p needs. */
void mo_bg_usage_of_plan(const struct mo_block_graph *bg, const struct mo_bg_plan *p,
			 struct mo_bg_usage *u)
{
	u->smem = p->bytes;
	u->regs_per_thread = 0;
	for (int first = 0; first < bg->body.n_ops; first++) {
		int last = p->tg_last[first];
		if (last < 0)
			continue;
		uint64_t most = 1;
		int live = 1; /* the value being computed */
		for (int i = first; i <= last; i++) {
			const struct mo_tp_op *op = &bg->body.ops[i];
			uint64_t n = mo_tensor_numel(&bg->body.tensors[op->out[0]]);
			most = n > most ? n : most;
			for (int k = 0; k < op->n_in; k++) {
				int pr = op->in[k] >= 0 ? bg->body.tensors[op->in[k]].producer : -1;
				if (pr < first || pr > last)
					live++; /* an operand loaded from shared memory */
			}
		}
		uint64_t per_thread = (most + MO_BLOCK_THREADS - 1) / MO_BLOCK_THREADS;
		if (per_thread > MO_TG_UNROLL)
			per_thread = MO_TG_UNROLL;
		uint64_t regs = 16 + per_thread * (uint64_t)live;
		int r = regs > 100000 ? 100000 : (int)regs;
		u->regs_per_thread = r > u->regs_per_thread ? r : u->regs_per_thread;
	}
}

void mo_bg_usage(const struct mo_block_graph *bg, struct mo_bg_usage *u)
{
	struct mo_bg_plan p;
	mo_bg_plan(bg, &p);
	mo_bg_usage_of_plan(bg, &p, u);
}
