/* The cost model (DESIGN §7): a roofline per kernel. Constants are public
 * datasheet peaks (dense, without sparsity); what matters for ranking is
 * their ratios. See superopt/search/SEARCH.md. */
#include "mo_search.h"

#include <math.h>
#include <string.h>

static const struct mo_gpu gpus[] = {
	/* A100 SXM 80 GB: 108 SMs, 2039 GB/s HBM2e, 312 TFLOP/s fp16 TC, 19.5 fp32 */
	{ "a100", MO_SM80, 108, 2039, 128 * 1.41 * 4, 312, 19.5, 3.0 },
	/* H100 SXM: 132 SMs, 3350 GB/s HBM3, 989 TFLOP/s fp16 TC, 67 fp32 */
	{ "h100", MO_SM90, 132, 3350, 128 * 1.83 * 4, 989, 67, 2.5 },
	/* H200 SXM: H100's SMs with 4800 GB/s HBM3e */
	{ "h200", MO_SM90, 132, 4800, 128 * 1.83 * 4, 989, 67, 2.5 },
};

const struct mo_gpu *mo_gpu_named(const char *name)
{
	for (size_t i = 0; i < sizeof gpus / sizeof *gpus; i++)
		if (strcmp(gpus[i].name, name) == 0)
			return &gpus[i];
	return NULL;
}

const struct mo_gpu *mo_gpu_of_target(enum mo_target t)
{
	return t == MO_SM80 ? &gpus[0] : &gpus[1];
}

static double bytes_of(const struct mo_tensor *t)
{
	size_t es = mo_onnx_dtype_size(t->dtype);
	return (double)mo_tensor_numel(t) * (double)(es ? es : 4);
}

/* One kernel: time from its DRAM traffic, its tensor-core and CUDA-core work,
 * the blocks it runs (bandwidth and compute scale with the SMs it keeps busy,
 * and a partial last wave costs a full one). */
static double kernel_us(const struct mo_gpu *g, double bytes, double tc_flops, double flops,
			double blocks)
{
	double busy = blocks >= g->sms ? 1.0 : blocks / g->sms;
	/* one partial wave is already in `busy`; beyond it, a partial last wave
	 * costs a whole one */
	double quant = blocks > g->sms ? ceil(blocks / g->sms) / (blocks / g->sms) : 1.0;
	double t_mem = bytes / (g->dram_gbs * 1e3 * busy);             /* µs */
	double t_tc = tc_flops / (g->tc_tflops * 1e6 * busy);
	double t_fp = flops / (g->fp32_tflops * 1e6 * busy);
	double t = t_mem > t_tc + t_fp ? t_mem : t_tc + t_fp;
	return t * quant + g->launch_us;
}

/* One op as its own kernel. `generated`: our pre-defined kernel (a thread per
 * element on CUDA cores, a layout op a copy), else a library's (tensor cores
 * for MatMul, layout ops that only reinterpret memory free). */
static void op_cost(const struct mo_tp *tp, const struct mo_tp_op *op, const struct mo_gpu *g,
		    bool generated, struct mo_cost *c)
{
	double bytes = 0, tc = 0, fl = 0;
	for (int i = 0; i < op->n_in; i++)
		if (op->in[i] >= 0)
			bytes += bytes_of(&tp->tensors[op->in[i]]);
	for (int i = 0; i < op->n_out; i++)
		if (op->out[i] >= 0)
			bytes += bytes_of(&tp->tensors[op->out[i]]);
	const struct mo_tensor *y = op->n_out ? &tp->tensors[op->out[0]] : NULL;
	double n = y ? (double)mo_tensor_numel(y) : 0;
	if (op->kind == MO_OP_MATMUL || op->kind == MO_OP_GEMM) {
		const struct mo_tensor *a = &tp->tensors[op->in[0]];
		tc = 2 * n * (double)a->dims[a->rank - 1];
	} else {
		fl = n;
	}
	if (generated) {
		fl += tc;
		tc = 0;
	} else if (op->lax == MO_LAX_LAYOUT && op->kind != MO_OP_TRANSPOSE &&
		   op->kind != MO_OP_CONCAT && op->kind != MO_OP_SLICE) { /* views */
		return;
	}
	/* a library kernel's grid covers its largest operand (a reduction or a
	 * MatMul with a small result splits the reduced axis across blocks);
	 * ours has a thread per output element */
	double cover = n;
	for (int i = 0; !generated && i < op->n_in; i++)
		if (op->in[i] >= 0 && (double)mo_tensor_numel(&tp->tensors[op->in[i]]) > cover)
			cover = (double)mo_tensor_numel(&tp->tensors[op->in[i]]);
	double blocks = cover / 4096 > 1 ? cover / 4096 : 1;
	c->us += kernel_us(g, bytes, tc, fl, blocks);
	c->dram_bytes += bytes;
	c->flops += tc + fl;
	c->kernels++;
}

static void program_cost(const struct mo_tp *tp, const struct mo_gpu *g, bool generated,
			 struct mo_cost *c)
{
	memset(c, 0, sizeof *c);
	for (int k = 0; k < tp->n_ops; k++)
		op_cost(tp, &tp->ops[k], g, generated, c);
}

void mo_cost_program(const struct mo_tp *tp, const struct mo_gpu *g, struct mo_cost *c)
{
	program_cost(tp, g, false, c);
}

void mo_cost_predefined(const struct mo_tp *tp, const struct mo_gpu *g, struct mo_cost *c)
{
	program_cost(tp, g, true, c);
}

void mo_cost_mugraph(const struct mo_mugraph *mg, const struct mo_gpu *g, struct mo_cost *c)
{
	mo_cost_mugraph_at(mg, g, NULL, c);
}

void mo_cost_mugraph_at(const struct mo_mugraph *mg, const struct mo_gpu *g, const int (*launch)[4],
			struct mo_cost *c)
{
	memset(c, 0, sizeof *c);
	for (int k = 0; k < mg->n_ops; k++) {
		const struct mo_kg_op *op = &mg->ops[k];
		if (!op->bg) { /* a pre-defined kernel, as codegen writes it */
			op_cost(&mg->kg, &op->op, g, true, c);
			continue;
		}
		const struct mo_block_graph *bg = op->bg;
		/* the blocks and iterations launched: the μGraph's, or fewer */
		int grid[3] = { bg->grid[0], bg->grid[1], bg->grid[2] }, forloop = bg->forloop;
		for (int d = 0; launch && d < 3; d++)
			if (launch[k][d] > 0 && launch[k][d] < grid[d])
				grid[d] = launch[k][d];
		if (launch && launch[k][3] > 0 && launch[k][3] < forloop)
			forloop = launch[k][3];
		double blocks = (double)grid[0] * grid[1] * grid[2];
		double bytes = 0, tc = 0, fl = 0;
		for (int i = 0; i < bg->n_iters; i++) {
			const struct mo_tensor *t = &bg->body.tensors[bg->iters[i].tile];
			/* a tile without an fmap is loaded once, not per iteration */
			double loads = bg->iters[i].fmap == MO_PHI ? 1 : forloop;
			bytes += bytes_of(t) * loads * blocks;
		}
		for (int i = 0; i < bg->n_savers; i++) { /* as the kernel tensor stores it */
			const struct mo_bg_saver *sv = &bg->savers[i];
			const struct mo_tensor *t = &mg->kg.tensors[sv->tensor];
			size_t es = mo_onnx_dtype_size(t->dtype);
			/* a ranged saver: only its range's blocks store */
			double by = sv->range.hi ? blocks / grid[sv->range.dim] *
				(sv->range.hi - sv->range.lo) : blocks;
			bytes += (double)mo_tensor_numel(&bg->body.tensors[sv->tile]) *
				 (double)(es ? es : 4) * by;
		}
		for (int i = 0; i < bg->body.n_ops; i++) {
			const struct mo_tp_op *b = &bg->body.ops[i];
			const struct mo_tensor *y = &bg->body.tensors[b->out[0]];
			double n = (double)mo_tensor_numel(y);
			bool in_loop = true;
			for (int a = 0; a < bg->n_accums; a++)
				if (bg->accums[a].out == b->in[0] ||
				    (b->n_in > 1 && bg->accums[a].out == b->in[1]))
					in_loop = false;
			double times = blocks * (in_loop ? forloop : 1);
			if (b->kind == MO_OP_MATMUL) {
				/* tensor cores work on 16x8x16 fragments: a smaller tile
				 * costs a whole fragment */
				const struct mo_tensor *a = &bg->body.tensors[b->in[0]];
				double m = (double)a->dims[a->rank - 2], k = (double)a->dims[a->rank - 1];
				double nn = (double)y->dims[y->rank - 1], batch = n / (m * nn);
				tc += 2 * batch * (m < 16 ? 16 : m) * (nn < 8 ? 8 : nn) * (k < 16 ? 16 : k) *
				      times;
			} else {
				fl += n * times;
			}
		}
		/* a block cannot beat the latency of its loads: about half a
		 * microsecond per for-loop iteration, per wave of blocks */
		double latency = ceil(blocks / g->sms) * forloop * 0.5;
		double t = kernel_us(g, bytes, tc, fl, blocks);
		c->us += t > latency + g->launch_us ? t : latency + g->launch_us;
		c->dram_bytes += bytes;
		c->flops += tc + fl;
		c->kernels++;
	}
}
