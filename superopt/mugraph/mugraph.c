/* Building, checking and composing μGraphs (the memory plan is in plan.c). */
#include "mugraph_int.h"

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
	if (op->p.n_sizes > 0 && op->p.sizes) { /* the caller's may not last */
		int64_t *sz = mo_arena_array(&mg->arena, (size_t)op->p.n_sizes, sizeof *sz);
		if (!sz)
			return fail(mg, "out of memory");
		memcpy(sz, op->p.sizes, (size_t)op->p.n_sizes * sizeof *sz);
		op->p.sizes = sz;
	}
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

/* Kernel tensor t, just made by a kernel computing `made` from kernel
 * tensors in[0..n): stored as fp32 while it passes between kernels, and
 * remembered as what it is (mo_mugraph.h, made_dtype). A kernel that reads
 * 2-byte tensors only as such fp32 intermediates (split-KV's combine
 * kernel) makes that 2-byte type, not fp32. */
static void made_between_kernels(struct mo_mugraph *mg, int t, int32_t made, const int *in, int n)
{
	for (int k = 0; k < n && made == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT; k++)
		if (in[k] >= 0 && in[k] < mg->kg.n_tensors && mo_mg_two_byte(mg->made_dtype[in[k]]))
			made = mg->made_dtype[in[k]];
	mg->made_dtype[t] = made;
	if (made == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT || mo_mg_two_byte(made))
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

bool mo_mg_rename(struct mo_mugraph *mg, const char *(*to)(void *ctx, const char *name),
		  void *ctx)
{
	for (int i = 0; i < mg->kg.n_tensors; i++) {
		struct mo_tensor *t = &mg->kg.tensors[i];
		if (t->kind != MO_T_INPUT && !t->is_graph_output)
			continue;
		const char *name = to(ctx, t->name);
		const char *copy = name ? mo_arena_strdup(&mg->arena, name) : NULL;
		if (!copy)
			return false;
		/* the INPUT and OUTPUT steps share the tensor's string */
		for (int k = 0; k < mg->n_steps; k++)
			if (mg->steps[k].name == t->name)
				mg->steps[k].name = copy;
		t->name = copy;
	}
	return true;
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
	int y = add_op(mg, &bg->body, kind, n_in, in, p);
	mo_bg_label_tile(&bg->body, kind, y);
	return y;
}

void mo_bg_label_tile(struct mo_tp *body, enum mo_op kind, int y)
{
	/* a computed tile holds fp32 whatever its operands' storage (only an
	 * iterator's tile holds its tensor's type, and a Cast's its target's),
	 * so a Cast of it to fp16 rounds, for the expressions and evaluators
	 * (mo_dtype_cast_rounds) as in the generated code */
	if (y >= 0 && kind != MO_OP_CAST &&
	    mo_dtype_cast_rounds(ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, body->tensors[y].dtype))
		body->tensors[y].dtype = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
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
	return mo_bg_save_range(mg, bg, tile, (const int[3]){ ox, oy, oz },
				(struct mo_bg_range){ 0, 0, 0 });
}

int mo_bg_save_range(struct mo_mugraph *mg, struct mo_block_graph *bg, int tile,
		     const int *omap, struct mo_bg_range r)
{
	if (!bg || tile < 0 || tile >= bg->body.n_tensors)
		return fail(mg, "saver of a missing tile");
	if (bg->n_savers == MO_MG_MAX)
		return fail(mg, "too many savers");
	if (r.hi == 0)
		r = (struct mo_bg_range){ 0, 0, 0 };
	else if (r.dim < 0 || r.dim > 2 || bg->grid[r.dim] < 2 || omap[r.dim] == MO_PHI ||
		 r.lo < 0 || r.lo >= r.hi || r.hi > bg->grid[r.dim])
		return fail(mg, "saver: a range that is not blocks of a grid dim it maps");
	struct mo_mg_step *s = log_step(mg, MO_STEP_SAVE, bg);
	if (s) {
		s->in[0] = tile;
		memcpy(s->map, omap, sizeof s->map);
		s->range = r;
	}
	const struct mo_tensor *src = &bg->body.tensors[tile];
	int64_t dims[MO_MAX_RANK];
	memcpy(dims, src->dims, sizeof dims);
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
		dims[d] *= r.hi && r.dim == g ? r.hi - r.lo : bg->grid[g];
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
	bg->savers[bg->n_savers++] =
		(struct mo_bg_saver){ tile, t, { omap[0], omap[1], omap[2] }, r };
	return t;
}

/* ---- checking ---- */

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
		mo_bg_usage_of_plan(bg, &plan, &u);
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
			tmap[ns++] = mo_bg_save_range(dst, bg, s->in[0], s->map, s->range);
			break;
		}
	}
	return dst->error[0] ? -1 : no;
}
