/* Building, checking and evaluating μGraphs. */
#include "mo_mugraph.h"
#include "superopt_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(struct mo_mugraph *mg, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int fail(struct mo_mugraph *mg, const char *fmt, ...)
{
	if (!mg->error[0]) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(mg->error, sizeof mg->error, fmt, ap);
		va_end(ap);
	}
	return -1;
}

static struct mo_mg_step *log_step(struct mo_mugraph *mg, enum mo_mg_step_kind kind,
				   const struct mo_block_graph *bg)
{
	if (mg->n_steps == MO_MG_MAX_STEPS) {
		fail(mg, "more than %d build steps", MO_MG_MAX_STEPS);
		return NULL;
	}
	struct mo_mg_step *s = &mg->steps[mg->n_steps++];
	memset(s, 0, sizeof *s);
	s->kind = kind;
	s->block = bg ? bg->index : -1;
	return s;
}

static void log_params(struct mo_mg_step *s, const struct mo_op_params *p)
{
	if (!p)
		return;
	s->p = *p;
	s->p.sizes = NULL;
	for (int i = 0; i < p->n_sizes && i < MO_MAX_RANK; i++)
		s->sizes[i] = p->sizes[i];
}

static bool tp_init(struct mo_mugraph *mg, struct mo_tp *tp)
{
	memset(tp, 0, sizeof *tp);
	tp->tensors = mo_arena_array(&mg->arena, MO_MG_MAX, sizeof *tp->tensors);
	tp->ops = mo_arena_array(&mg->arena, MO_MG_MAX, sizeof *tp->ops);
	tp->outputs = mo_arena_array(&mg->arena, MO_MG_MAX, sizeof *tp->outputs);
	tp->inputs = mo_arena_array(&mg->arena, MO_MG_MAX, sizeof *tp->inputs);
	tp->node_names = mo_arena_array(&mg->arena, MO_MG_MAX, sizeof *tp->node_names);
	return tp->tensors && tp->ops && tp->outputs && tp->inputs && tp->node_names;
}

struct mo_mugraph *mo_mg_new(void)
{
	struct mo_mugraph *mg = mo_calloc(1, sizeof *mg);
	if (!mg)
		return NULL;
	mo_arena_init(&mg->arena);
	if (!tp_init(mg, &mg->kg)) {
		mo_mg_free(mg);
		return NULL;
	}
	return mg;
}

void mo_mg_free(struct mo_mugraph *mg)
{
	if (!mg)
		return;
	mo_arena_free(&mg->arena);
	mo_free(mg);
}

static int new_tensor(struct mo_mugraph *mg, struct mo_tp *tp, const char *name)
{
	if (tp->n_tensors == MO_MG_MAX)
		return fail(mg, "more than %d tensors", MO_MG_MAX);
	int i = tp->n_tensors++;
	struct mo_tensor *t = &tp->tensors[i];
	memset(t, 0, sizeof *t);
	t->name = name ? mo_arena_strdup(&mg->arena, name)
		       : mo_arena_printf(&mg->arena, "t%d", i);
	t->kind = MO_T_VALUE;
	t->producer = -1;
	t->source_node = -1;
	return t->name ? i : fail(mg, "out of memory");
}

int mo_mg_input(struct mo_mugraph *mg, const char *name, int32_t dtype, int rank,
		const int64_t *dims)
{
	int i = new_tensor(mg, &mg->kg, name);
	if (i < 0)
		return -1;
	struct mo_tensor *t = &mg->kg.tensors[i];
	t->kind = MO_T_INPUT;
	t->dtype = dtype;
	struct mo_mg_step *s = log_step(mg, MO_STEP_INPUT, NULL);
	if (s) {
		s->name = t->name;
		s->dtype = dtype;
		s->rank = rank;
		memcpy(s->dims, dims, sizeof(int64_t) * (size_t)(rank > 0 ? rank : 0));
	}
	if (!mo_tensor_set_shape(t, rank, dims))
		return fail(mg, "input '%s' has an absurd shape", name);
	mg->kg.inputs[mg->kg.n_inputs++] = i;
	return i;
}

/* Appends an op to tp with one output and infers its shape. */
static int add_op(struct mo_mugraph *mg, struct mo_tp *tp, enum mo_op kind, int n_in,
		  const int *in, const struct mo_op_params *p)
{
	if (n_in < 1 || n_in > 3)
		return fail(mg, "%s: bad operand count", mo_op_table[kind].name);
	for (int k = 0; k < n_in; k++)
		if (in[k] < 0 || in[k] >= tp->n_tensors)
			return fail(mg, "%s: bad operand", mo_op_table[kind].name);
	if (tp->n_ops == MO_MG_MAX)
		return fail(mg, "more than %d ops", MO_MG_MAX);
	int y = new_tensor(mg, tp, NULL);
	if (y < 0)
		return -1;
	struct mo_tp_op *op = &tp->ops[tp->n_ops];
	memset(op, 0, sizeof *op);
	op->kind = kind;
	op->lax = mo_op_table[kind].lax;
	op->exps = mo_op_table[kind].exps;
	op->node = tp->n_ops;
	op->in = mo_arena_array(&mg->arena, 3, sizeof(int));
	op->out = mo_arena_array(&mg->arena, 1, sizeof(int));
	if (!op->in || !op->out)
		return fail(mg, "out of memory");
	memcpy(op->in, in, (size_t)n_in * sizeof *in);
	op->n_in = n_in;
	op->out[0] = y;
	op->n_out = 1;
	if (p)
		op->p = *p;
	if (kind == MO_OP_POW && !op->p.has_exponent)
		return fail(mg, "Pow needs an exponent");
	const char *why = NULL;
	if (!mo_tp_infer(tp, op, &why))
		return fail(mg, "%s: %s", mo_op_table[kind].name, why);
	tp->tensors[y].producer = tp->n_ops;
	tp->node_names[tp->n_ops] = mo_op_table[kind].name;
	tp->n_ops++;
	return y;
}

static bool two_byte(int32_t dt);

/* Kernel tensor t, just made by a kernel computing `made` from kernel
 * tensors in[0..n): stored as fp32 while it passes between kernels, and
 * remembered as what it is (mo_mugraph.h, made_dtype). A kernel that reads
 * 2-byte tensors only as such fp32 intermediates (split-KV's combine
 * kernel) makes that 2-byte type, not fp32. */
static void made_between_kernels(struct mo_mugraph *mg, int t, int32_t made, const int *in, int n)
{
	for (int k = 0; k < n && made == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT; k++)
		if (in[k] >= 0 && in[k] < mg->kg.n_tensors && two_byte(mg->made_dtype[in[k]]))
			made = mg->made_dtype[in[k]];
	mg->made_dtype[t] = made;
	if (made == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || two_byte(made))
		mg->kg.tensors[t].dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
}

int mo_mg_kernel(struct mo_mugraph *mg, enum mo_op kind, int n_in, const int *in,
		 const struct mo_op_params *p)
{
	if (mg->n_ops == MO_MG_MAX)
		return fail(mg, "more than %d kernels", MO_MG_MAX);
	int before = mg->kg.n_ops;
	struct mo_mg_step *s = log_step(mg, MO_STEP_KERNEL, NULL);
	if (s) {
		s->op = kind;
		s->n_in = n_in > 3 ? 3 : n_in;
		memcpy(s->in, in, sizeof(int) * (size_t)s->n_in);
		log_params(s, p);
	}
	int y = add_op(mg, &mg->kg, kind, n_in, in, p);
	if (y < 0)
		return -1;
	made_between_kernels(mg, y, mg->kg.tensors[y].dtype, in, n_in);
	/* kernel ops live in mg->ops; kg.ops only served inference */
	mg->ops[mg->n_ops++] = (struct mo_kg_op){ .bg = NULL, .op = mg->kg.ops[before] };
	return y;
}

void mo_mg_output(struct mo_mugraph *mg, int tensor, const char *name)
{
	if (tensor < 0 || tensor >= mg->kg.n_tensors) {
		fail(mg, "output '%s' is not a tensor", name);
		return;
	}
	mg->kg.tensors[tensor].name = mo_arena_strdup(&mg->arena, name);
	struct mo_mg_step *s = log_step(mg, MO_STEP_OUTPUT, NULL);
	if (s) {
		s->in[0] = tensor;
		s->name = mg->kg.tensors[tensor].name;
	}
	mg->kg.tensors[tensor].is_graph_output = true;
	if (mg->made_dtype[tensor]) /* stored as what its kernel makes */
		mg->kg.tensors[tensor].dtype = mg->made_dtype[tensor];
	mg->kg.outputs[mg->kg.n_outputs++] = tensor;
}

void mo_mg_output_dtypes(struct mo_mugraph *mg, const struct mo_tp *prog)
{
	for (int i = 0; i < mg->kg.n_outputs; i++) {
		struct mo_tensor *t = &mg->kg.tensors[mg->kg.outputs[i]];
		for (int k = 0; k < prog->n_outputs; k++)
			if (strcmp(prog->tensors[prog->outputs[k]].name, t->name) == 0)
				t->dtype = prog->tensors[prog->outputs[k]].dtype;
	}
}

struct mo_block_graph *mo_mg_block(struct mo_mugraph *mg, int gx, int gy, int gz,
				   int forloop)
{
	if (mg->n_ops == MO_MG_MAX) {
		fail(mg, "more than %d kernels", MO_MG_MAX);
		return NULL;
	}
	if (gx < 1 || gy < 1 || gz < 1 || forloop < 1) {
		fail(mg, "grid and for-loop must be positive");
		return NULL;
	}
	struct mo_block_graph *bg = mo_arena_alloc(&mg->arena, sizeof *bg);
	if (!bg || !tp_init(mg, &bg->body)) {
		fail(mg, "out of memory");
		return NULL;
	}
	bg->grid[0] = gx;
	bg->grid[1] = gy;
	bg->grid[2] = gz;
	bg->forloop = forloop;
	bg->index = mg->n_blocks;
	mg->blocks[mg->n_blocks++] = bg;
	struct mo_mg_step *s = log_step(mg, MO_STEP_BLOCK, NULL);
	if (s) {
		s->grid[0] = gx;
		s->grid[1] = gy;
		s->grid[2] = gz;
		s->forloop = forloop;
	}
	mg->ops[mg->n_ops++] = (struct mo_kg_op){ .bg = bg };
	return bg;
}

int mo_bg_iter(struct mo_mugraph *mg, struct mo_block_graph *bg, int tensor,
	       int ix, int iy, int iz, int fmap)
{
	if (!bg || tensor < 0 || tensor >= mg->kg.n_tensors)
		return fail(mg, "iterator over a missing tensor");
	struct mo_mg_step *s = log_step(mg, MO_STEP_ITER, bg);
	if (s) {
		s->in[0] = tensor;
		s->map[0] = ix;
		s->map[1] = iy;
		s->map[2] = iz;
		s->fmap = fmap;
	}
	if (bg->n_iters == MO_MG_MAX)
		return fail(mg, "too many iterators");
	const struct mo_tensor *t = &mg->kg.tensors[tensor];
	int64_t dims[MO_MAX_RANK];
	memcpy(dims, t->dims, sizeof dims);
	int imap[3] = { ix, iy, iz };
	for (int g = 0; g < 3; g++) {
		int d = imap[g];
		if (d == MO_PHI)
			continue;
		if (d < 0 || d >= t->rank || dims[d] % bg->grid[g])
			return fail(mg, "imap: grid dim %d does not divide dim %d of '%s'", g, d,
				    t->name);
		dims[d] /= bg->grid[g];
	}
	if (fmap != MO_PHI) {
		if (fmap < 0 || fmap >= t->rank || dims[fmap] % bg->forloop)
			return fail(mg, "fmap: the for-loop does not divide dim %d of '%s'", fmap,
				    t->name);
		dims[fmap] /= bg->forloop;
	}
	int tile = new_tensor(mg, &bg->body, NULL);
	if (tile < 0)
		return -1;
	struct mo_tensor *x = &bg->body.tensors[tile];
	x->kind = MO_T_INPUT;
	x->dtype = t->dtype;
	mo_tensor_set_shape(x, t->rank, dims);
	bg->iters[bg->n_iters++] = (struct mo_bg_iter){ tile, tensor, { ix, iy, iz }, fmap };
	return tile;
}

int mo_bg_op(struct mo_mugraph *mg, struct mo_block_graph *bg, enum mo_op kind, int n_in,
	     const int *in, const struct mo_op_params *p)
{
	if (!bg)
		return fail(mg, "no block graph");
	struct mo_mg_step *s = log_step(mg, MO_STEP_OP, bg);
	if (s) {
		s->op = kind;
		s->n_in = n_in > 3 ? 3 : n_in;
		memcpy(s->in, in, sizeof(int) * (size_t)(n_in > 0 ? s->n_in : 0));
		log_params(s, p);
	}
	return add_op(mg, &bg->body, kind, n_in, in, p);
}

bool mo_bg_sub_of_max(const struct mo_tp *body, const struct mo_tp_op *op)
{
	if (op->kind != MO_OP_SUB || op->n_in < 2 || op->in[1] < 0)
		return false;
	int prod = body->tensors[op->in[1]].producer;
	return prod >= 0 && body->ops[prod].kind == MO_OP_REDUCE_MAX;
}

int mo_bg_const(struct mo_mugraph *mg, struct mo_block_graph *bg, double value)
{
	if (!bg)
		return fail(mg, "no block graph");
	struct mo_mg_step *s = log_step(mg, MO_STEP_CONST, bg);
	if (s)
		s->value = value;
	int c = new_tensor(mg, &bg->body, NULL);
	if (c < 0)
		return -1;
	struct mo_tensor *t = &bg->body.tensors[c];
	t->kind = MO_T_CONST;
	t->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
	mo_tensor_set_shape(t, 0, NULL);
	t->fvals = mo_arena_alloc(&mg->arena, sizeof *t->fvals);
	if (!t->fvals)
		return fail(mg, "out of memory");
	t->fvals[0] = value;
	t->n_vals = 1;
	return c;
}

static int add_accum(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
		     enum mo_accum_kind kind, int max_tile)
{
	if (!bg || tile < 0 || tile >= bg->body.n_tensors)
		return fail(mg, "accumulator of a missing tile");
	if (bg->n_accums == MO_MG_MAX)
		return fail(mg, "too many accumulators");
	struct mo_mg_step *s = log_step(mg, MO_STEP_ACCUM, bg);
	if (s) {
		s->in[0] = tile;
		s->in[1] = max_tile;
		s->n_in = max_tile >= 0 ? 2 : 1;
		s->fmap = (int)kind;
	}
	const struct mo_tensor *src = &bg->body.tensors[tile];
	if (kind == MO_ACC_RESCALED) {
		if (max_tile < 0 || max_tile >= bg->body.n_tensors)
			return fail(mg, "rescaled accumulator without a max tile");
		const struct mo_tensor *m = &bg->body.tensors[max_tile];
		if (m->rank != src->rank)
			return fail(mg, "rescaled accumulator: the max tile has rank %d, the tile %d",
				    m->rank, src->rank);
		for (int d = 0; d < m->rank; d++)
			if (m->dims[d] != 1 && m->dims[d] != src->dims[d])
				return fail(mg, "rescaled accumulator: the max tile does not broadcast "
					    "over the tile (dim %d)", d);
	}
	int out = new_tensor(mg, &bg->body, NULL);
	if (out < 0)
		return -1;
	struct mo_tensor *x = &bg->body.tensors[out];
	x->dtype = src->dtype;
	mo_tensor_set_shape(x, src->rank, src->dims);
	bg->accums[bg->n_accums++] = (struct mo_bg_accum){ tile, out, kind, max_tile };
	return out;
}

int mo_bg_accum(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
		enum mo_accum_kind kind)
{
	if (kind == MO_ACC_RESCALED)
		return fail(mg, "a rescaled accumulator needs its max tile");
	return add_accum(mg, bg, tile, kind, -1);
}

int mo_bg_accum_rescaled(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
			 int max_tile)
{
	return add_accum(mg, bg, tile, MO_ACC_RESCALED, max_tile);
}

int mo_bg_thread_graph(struct mo_mugraph *mg, struct mo_block_graph *bg, int first_tile,
		       int last_tile)
{
	if (!bg)
		return fail(mg, "no block graph");
	struct mo_mg_step *s = log_step(mg, MO_STEP_THREAD, bg);
	if (s) {
		s->in[0] = first_tile;
		s->in[1] = last_tile;
		s->n_in = 2;
	}
	const struct mo_tp *b = &bg->body;
	if (first_tile < 0 || first_tile >= b->n_tensors || last_tile < 0 ||
	    last_tile >= b->n_tensors)
		return fail(mg, "thread graph: missing tile");
	int first = b->tensors[first_tile].producer, last = b->tensors[last_tile].producer;
	if (first < 0 || last < first)
		return fail(mg, "thread graph: tiles %d..%d are not made by a run of block ops",
			    first_tile, last_tile);
	for (int i = first; i <= last; i++) {
		if (!mo_op_elementwise(b->ops[i].kind))
			return fail(mg, "thread graph: %s is not element-wise",
				    mo_op_table[b->ops[i].kind].name);
		for (int g = 0; g < bg->n_tgs; g++)
			if (i >= bg->tgs[g].first && i <= bg->tgs[g].last)
				return fail(mg, "thread graph: a block op is in two thread graphs");
	}
	if (bg->n_tgs == MO_MG_MAX / 2)
		return fail(mg, "too many thread graphs");
	bg->tgs[bg->n_tgs] = (struct mo_thread_graph){ first, last };
	return bg->n_tgs++;
}

int mo_bg_save(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile, int ox, int oy,
	       int oz)
{
	if (!bg || tile < 0 || tile >= bg->body.n_tensors)
		return fail(mg, "saver of a missing tile");
	if (bg->n_savers == MO_MG_MAX)
		return fail(mg, "too many savers");
	struct mo_mg_step *s = log_step(mg, MO_STEP_SAVE, bg);
	if (s) {
		s->in[0] = tile;
		s->map[0] = ox;
		s->map[1] = oy;
		s->map[2] = oz;
	}
	const struct mo_tensor *src = &bg->body.tensors[tile];
	int64_t dims[MO_MAX_RANK];
	memcpy(dims, src->dims, sizeof dims);
	int omap[3] = { ox, oy, oz };
	bool used[MO_MAX_RANK] = { false };
	for (int g = 0; g < 3; g++) {
		int d = omap[g];
		if (d == MO_PHI) {
			if (bg->grid[g] > 1)
				return fail(mg, "omap: grid dim %d > 1 must map to an output dim", g);
			continue;
		}
		if (d < 0 || d >= src->rank || used[d])
			return fail(mg, "omap: bad output dim %d", d);
		used[d] = true;
		dims[d] *= bg->grid[g];
	}
	int t = new_tensor(mg, &mg->kg, NULL);
	if (t < 0)
		return -1;
	struct mo_tensor *x = &mg->kg.tensors[t];
	x->dtype = src->dtype;
	int read[MO_MG_MAX];
	for (int i = 0; i < bg->n_iters; i++)
		read[i] = bg->iters[i].tensor;
	made_between_kernels(mg, t, src->dtype, read, bg->n_iters);
	if (!mo_tensor_set_shape(x, src->rank, dims))
		return fail(mg, "saver makes an absurd shape");
	bg->savers[bg->n_savers++] = (struct mo_bg_saver){ tile, t, { ox, oy, oz } };
	return t;
}

/* ---- checking ---- */

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

bool mo_same_shape(const struct mo_tensor *a, const struct mo_tensor *b)
{
	if (a->rank != b->rank)
		return false;
	for (int d = 0; d < a->rank; d++)
		if (a->dims[d] != b->dims[d])
			return false;
	return true;
}

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

static bool two_byte(int32_t dt)
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
		p->elem[t] = two_byte(dt) ? 2 : 4;
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
		if (two_byte(t->dtype))
			m->dtype = t->dtype;
	}
	if (!two_byte(m->dtype))
		return false;
	int64_t M = Y->dims[Y->rank - 2], N = Y->dims[Y->rank - 1], K = A->dims[A->rank - 1];
	if (K % 16 || N % 16 || M % 8 || A->dims[A->rank - 2] != M || B->dims[B->rank - 2] != K ||
	    B->dims[B->rank - 1] != N)
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
static void usage_of(const struct mo_block_graph *bg, const struct mo_bg_plan *p,
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
		uint64_t regs = 16 + per_thread * (uint64_t)live;
		int r = regs > 100000 ? 100000 : (int)regs;
		u->regs_per_thread = r > u->regs_per_thread ? r : u->regs_per_thread;
	}
}

void mo_bg_usage(const struct mo_block_graph *bg, struct mo_bg_usage *u)
{
	struct mo_bg_plan p;
	mo_bg_plan(bg, &p);
	usage_of(bg, &p, u);
}

bool mo_mg_valid(const struct mo_mugraph *mg, enum mo_target target, char *why,
		 size_t why_len)
{
	return mo_mg_valid_smem(mg, target, mo_target_smem(target), why, why_len);
}

bool mo_mg_valid_smem(const struct mo_mugraph *mg, enum mo_target target, uint64_t smem_limit,
		      char *why, size_t why_len)
{
	if (mg->error[0]) {
		snprintf(why, why_len, "%s", mg->error);
		return false;
	}
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_block_graph *bg = mg->ops[k].bg;
		if (!bg)
			continue;
		/* CUDA's grid: x up to 2^31 - 1 blocks, y and z up to 65 535 */
		for (int d = 0; d < 3; d++)
			if (bg->grid[d] > (d ? 65535 : 2147483647)) {
				snprintf(why, why_len, "kernel %d: grid %c dim %d is over CUDA's %d",
					 k + 1, "xyz"[d], bg->grid[d], d ? 65535 : 2147483647);
				return false;
			}
		struct mo_bg_plan plan;
		mo_bg_plan(bg, &plan);
		struct mo_bg_usage u;
		usage_of(bg, &plan, &u);
		if (u.smem > smem_limit) {
			snprintf(why, why_len, "kernel %d: tiles need %llu bytes of shared memory, "
				 "the target has %llu", k + 1, (unsigned long long)u.smem,
				 (unsigned long long)smem_limit);
			return false;
		}
		if (u.regs_per_thread > mo_target_regs_per_thread(target) ||
		    (int64_t)u.regs_per_thread * MO_BLOCK_THREADS > mo_target_regs_per_sm(target)) {
			snprintf(why, why_len, "kernel %d: a thread graph needs %d registers per "
				 "thread, the target allows %d", k + 1, u.regs_per_thread,
				 mo_target_regs_per_thread(target));
			return false;
		}
		for (int s = 0; s < bg->n_savers; s++) {
			int tile = bg->savers[s].tile;
			if (bg->forloop > 1 && !plan.post[tile]) {
				snprintf(why, why_len, "kernel %d: a saved tile does not pass through "
					 "an accumulator, but the for-loop runs %d times", k + 1,
					 bg->forloop);
				return false;
			}
		}
		for (int a = 0; a < bg->n_accums; a++) {
			int m = bg->accums[a].max_in;
			if (plan.post[bg->accums[a].in] || (m >= 0 && plan.post[m])) {
				snprintf(why, why_len, "kernel %d: an accumulator reads a value made "
					 "after the for-loop", k + 1);
				return false;
			}
		}
	}
	for (int i = 0; i < mg->kg.n_outputs; i++) {
		const struct mo_tensor *t = &mg->kg.tensors[mg->kg.outputs[i]];
		if (!t->shape_known) {
			snprintf(why, why_len, "output '%s' has no shape", t->name);
			return false;
		}
	}
	return true;
}

/* ---- composing ---- */

int mo_mg_append(struct mo_mugraph *dst, const struct mo_mugraph *src, int n_bound,
		 const char *const *bound_names, const int *bound, int *outs)
{
	int tmap[MO_MG_MAX]; /* src kernel tensor -> dst kernel tensor */
	struct mo_block_graph *bmap[MO_MG_MAX];
	int ns = 0, nb = 0, no = 0;
	if (src->error[0])
		return fail(dst, "appending a broken μGraph: %s", src->error);
	for (int i = 0; i < src->n_steps && !dst->error[0]; i++) {
		const struct mo_mg_step *s = &src->steps[i];
		struct mo_block_graph *bg = s->block >= 0 && s->block < nb ? bmap[s->block] : NULL;
		struct mo_op_params p = s->p;
		if (p.n_sizes > 0)
			p.sizes = (int64_t *)s->sizes;
		int in[3] = { -1, -1, -1 };
		for (int k = 0; k < s->n_in && k < 3; k++)
			in[k] = s->kind == MO_STEP_KERNEL ? s->in[k] >= 0 && s->in[k] < ns
								 ? tmap[s->in[k]] : -1
							 : s->in[k];
		if (ns >= MO_MG_MAX || nb >= MO_MG_MAX)
			return fail(dst, "appending: more than %d tensors", MO_MG_MAX);
		switch (s->kind) {
		case MO_STEP_INPUT: {
			int t = -1;
			for (int k = 0; k < n_bound && t < 0; k++)
				if (strcmp(bound_names[k], s->name) == 0)
					t = bound[k];
			for (int k = 0; k < dst->kg.n_inputs && t < 0; k++)
				if (strcmp(dst->kg.tensors[dst->kg.inputs[k]].name, s->name) == 0)
					t = dst->kg.inputs[k];
			tmap[ns++] = t >= 0 ? t : mo_mg_input(dst, s->name, s->dtype, s->rank, s->dims);
			break;
		}
		case MO_STEP_KERNEL:
			tmap[ns++] = mo_mg_kernel(dst, s->op, s->n_in, in, &p);
			break;
		case MO_STEP_OUTPUT:
			if (s->in[0] < 0 || s->in[0] >= ns)
				return fail(dst, "appending: output of a missing tensor");
			outs[no++] = tmap[s->in[0]];
			break;
		case MO_STEP_BLOCK:
			bmap[nb++] = mo_mg_block(dst, s->grid[0], s->grid[1], s->grid[2], s->forloop);
			break;
		case MO_STEP_ITER:
			if (s->in[0] < 0 || s->in[0] >= ns)
				return fail(dst, "appending: iterator over a missing tensor");
			mo_bg_iter(dst, bg, tmap[s->in[0]], s->map[0], s->map[1], s->map[2], s->fmap);
			break;
		case MO_STEP_OP:
			mo_bg_op(dst, bg, s->op, s->n_in, in, &p);
			break;
		case MO_STEP_CONST:
			mo_bg_const(dst, bg, s->value);
			break;
		case MO_STEP_ACCUM:
			if (s->fmap == MO_ACC_RESCALED)
				mo_bg_accum_rescaled(dst, bg, s->in[0], s->in[1]);
			else
				mo_bg_accum(dst, bg, s->in[0], (enum mo_accum_kind)s->fmap);
			break;
		case MO_STEP_THREAD:
			mo_bg_thread_graph(dst, bg, s->in[0], s->in[1]);
			break;
		case MO_STEP_SAVE:
			tmap[ns++] = mo_bg_save(dst, bg, s->in[0], s->map[0], s->map[1], s->map[2]);
			break;
		}
	}
	return dst->error[0] ? -1 : no;
}
