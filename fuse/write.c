/* What a run writes: the fused nodes (and which of them export), the
 * manifest, and the file set OUT, its plugin and manifest. */
#include "fuse_int.h"

#include <signal.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* OUT minus ".onnx", plus suffix. */
void mo_fuse_beside(const char *out, const char *suffix, char *buf, size_t len)
{
	size_t n = strlen(out);
	if (n > 5 && strcmp(out + n - 5, ".onnx") == 0)
		n -= 5;
	snprintf(buf, len, "%.*s%s", (int)n, out, suffix);
}
const char *fuse_base_name(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}
/* Per region the μGraphs the GPU code chooses from and the GPUs built for
 * each serves: variant 0 is "mugraph" (below), the others listed in full. */
static void write_variants(FILE *f, const struct mo_fuse_region *s, const struct mo_fuse_options *a)
{
	int sm[MO_CG_MAX_ARCHS];
	uint64_t lim[MO_CG_MAX_ARCHS];
	int n = fuse_cuda_archs(a, sm, lim);
	fputs(",\n     \"variants\": [", f);
	for (int v = 0; v <= s->n_var; v++) {
		const struct mo_mugraph *mg = v ? s->var_mg[v - 1] : s->r.best;
		fprintf(f, "%s\n       {\"variant\": %d, \"smem_bytes\": %llu, \"serves\": [", v ? "," : "",
			v, (unsigned long long)mo_mg_smem(mg));
		int k = 0;
		for (int i = 0; i < n; i++)
			if (fuse_variant_for(s, lim[i]) == v)
				fprintf(f, "%s\"sm_%d\"", k++ ? ", " : "", sm[i]);
		fputc(']', f);
		if (v > 0) {
			const struct mo_search_result *r = &s->var[v - 1];
			const struct mo_equiv_report *e = &r->verification;
			fprintf(f, ", \"searched_for_bytes\": %llu, \"cost_us\": %.3f, \"kernels\": %d,\n"
				"        \"verification\": {\"trials\": %d, \"error_bound\": %.3g, \"degree\": "
				"%d, \"float_max_rel\": %.3g, \"float_max_abs\": %.3g},\n        \"mugraph\": ",
				(unsigned long long)s->var_limit[v - 1], r->cost_best.us, mg->n_ops,
				e->trials_run, e->error_bound, e->degree, e->float_max_rel, e->float_max_abs);
			mo_mg_print_json(mg, f);
		}
		fputc('}', f);
	}
	fputc(']', f);
}
/* The manifest into f; false on a write error (fsynced, not closed). */
/* The graph inputs' shapes as imported (symbolic dims bound by --dim,
 * --input-shape applied), as the JSON object mirage.input_shapes records;
 * inputs of unknown shape are left out. NULL when out of memory. */
static char *input_shapes_json(const struct mo_tp *tp)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return NULL;
	fputc('{', f);
	bool first = true;
	for (int i = 0; i < tp->n_inputs; i++) {
		const struct mo_tensor *t = &tp->tensors[tp->inputs[i]];
		if (!t->shape_known)
			continue;
		fputs(first ? "" : ", ", f);
		first = false;
		mo_json_string(f, t->name);
		fputs(": [", f);
		for (int k = 0; k < t->rank; k++)
			fprintf(f, "%s%lld", k ? ", " : "", (long long)t->dims[k]);
		fputc(']', f);
	}
	fputc('}', f);
	if (fclose(f) != 0) {
		free(buf);
		return NULL;
	}
	return buf;
}
/* The fused ops n writes: itself and its larger buckets'. */
static int fused_ops_in(const struct mo_fused_node *n)
{
	int c = 1;
	for (int k = 0; k < n->n_next; k++)
		c += fused_ops_in(&n->next[k]);
	return c;
}

/* A padded region's extents, pads and checks, for the manifest. */
static void write_padded(FILE *f, const struct mo_fuse_region *s)
{
	const struct mo_tp *kg = &s->r.best->kg;
	/* against the ops at the search sizes, and where its saving was
	 * judged when elsewhere (a larger bucket of --dim NAME=A,B,...: at
	 * the bucket before's sizes, the least it serves; a first bucket
	 * below the search sizes: at its own) */
	fprintf(f, ",\n     \"padded\": {\"bucket_level\": %d, \"serves_search_sizes\": %s, "
		"\"unfused_cost_us_at_search_size\": %.3f, ", s->level,
		s->serves_search ? "true" : "false", s->unfused_us_search);
	if (s->worth_at != FUSE_WORTH_SEARCH)
		fprintf(f, "\"unfused_cost_us_at_%s\": %.3f, ", fuse_worth_at(s, true),
			s->unfused_us_worth);
	/* its own estimate there, its launches cut to the sizes (absent at
	 * sizes past its bucket) */
	if (s->cut_us_search > 0)
		fprintf(f, "\"cost_us_at_search_size\": %.3f, ", s->cut_us_search);
	if (s->worth_at != FUSE_WORTH_SEARCH && s->cut_us_worth > 0)
		fprintf(f, "\"cost_us_at_%s\": %.3f, ", fuse_worth_at(s, true), s->cut_us_worth);
	fputs("\"extents\": [", f);
	for (int e = 0; e < s->n_ext; e++) {
		fprintf(f, "%s{\"name\": ", e ? ", " : "");
		mo_json_string(f, s->ext_name[e]);
		fprintf(f, ", \"bucket\": %lld, \"looped\": %s}", (long long)s->ext_bucket[e],
			s->ext_loop[e] ? "true" : "false");
	}
	fputs("], \"pads\": [", f);
	bool first = true;
	for (int i = 0; i < kg->n_inputs; i++) {
		bool padded = false;
		for (int d = 0; d < MO_PLUGIN_MAX_RANK; d++) {
			int e = s->in_ext[i * MO_PLUGIN_MAX_RANK + d];
			padded |= e >= 0 && !s->ext_loop[e];
		}
		if (!padded)
			continue;
		fprintf(f, "%s{\"input\": ", first ? "" : ", ");
		mo_json_string(f, kg->tensors[kg->inputs[i]].name);
		bool bool_in = kg->tensors[kg->inputs[i]].dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL;
		const char *pad = !s->in_pad[i] ? "zero" : bool_in ? "false"
				  : s->in_pad[i] == 2 ? "lowest" : "-inf";
		fprintf(f, ", \"pad\": \"%s\"}", pad);
		first = false;
	}
	fputs("], \"checked_at\": [", f);
	static const int slot[3] = { 4, 1, 2 };
	const struct mo_plugin_check *c[3] = { &s->check_distinct, &s->check_probe, &s->check_one };
	first = true;
	for (int q = 0; q < 3; q++) {
		if (!fuse_dyn_fits(s, slot[q]))
			continue;
		fprintf(f, "%s{\"extents\": [", first ? "" : ", ");
		for (int e = 0; e < s->n_ext; e++)
			fprintf(f, "%s%lld", e ? ", " : "", (long long)s->ext_vals[e][slot[q]]);
		fprintf(f, "], \"max_rel\": %.3g}", c[q]->max_rel);
		first = false;
	}
	/* the launches cut to the sizes (plugins/CODEGEN.md): the runs at
	 * sizes around each tile that matched the whole grids and loops */
	fprintf(f, "], \"cut_launches_checked\": %d}", s->check_limits.plans);
}

static bool write_manifest(FILE *f, const char *model, const char *plugin, const char *domain,
			   const char *build_id, const struct mo_tp *tp, int nu,
			   const struct mo_fuse_region *rs, const struct mo_fuse_options *a,
			   const char *dynamic, const struct mo_import_readings *rd,
			   const struct mo_fuse_layers *ls)
{
	fprintf(f, "{\n  \"model\": ");
	mo_json_string(f, model);
	if (rd && rd->n > 0) { /* derived dims read as the graph needs them */
		fprintf(f, ",\n  \"dims_read_as\": {");
		for (int k = 0; k < rd->n; k++) {
			fprintf(f, "%s", k ? ", " : "");
			mo_json_string(f, rd->reading_of[k]);
			fprintf(f, ": ");
			mo_json_string(f, rd->read_as[k]);
		}
		fprintf(f, "}");
	}
	if (dynamic) { /* dims left symbolic: the sizes the search ran at */
		fprintf(f, ",\n  \"dynamic_dims_searched_at\": ");
		mo_json_string(f, dynamic);
	}
	fprintf(f, ",\n  \"plugin\": ");
	if (plugin)
		mo_json_string(f, plugin);
	else
		fputs("null", f);
	fprintf(f, ",\n  \"domain\": \"%s\",\n  \"build\": \"%s\",\n  \"target\": \"%s\",\n"
		"  \"regions\": [", domain, build_id, a->search->target == MO_SM80 ? "sm_80" : "sm_90");
	for (int ri = 0; ri < nu; ri++) {
		const struct mo_region *rg = rs[ri].rg;
		const struct mo_fuse_region *s = &rs[ri];
		char lb[32];
		fprintf(f, "%s\n    {\"region\": \"%s\", \"nodes\": [", ri ? "," : "",
			fuse_label(rs, ri, lb, sizeof lb));
		for (int i = 0; i < rg->n_nodes; i++) {
			fputs(i ? ", " : "", f);
			mo_json_string(f, tp->node_names[rg->nodes[i]]);
		}
		fprintf(f, "], \"fused\": %s, \"split_into_parts\": %s", s->fused ? "true" : "false",
			s->split ? "true" : "false");
		if (s->same_as) /* its search was that region's (an identical layer) */
			fprintf(f, ", \"identical_to\": \"%s\"",
				fuse_label(rs, s->same_as - 1, lb, sizeof lb));
		if (s->fused) {
			fprintf(f, ", \"op_type\": \"%s\", \"cuda\": %s, \"tensorrt\": %s, "
				"\"function\": %s", s->op_type, s->cuda ? "true" : "false",
				s->tensorrt ? "true" : "false", s->no_function ? "false" : "true");
		} else {
			fputs(", \"why\": ", f);
			mo_json_string(f, s->why);
		}
		if (s->r.best) {
			const struct mo_equiv_report *v = &s->r.verification;
			fprintf(f, ", \"cached\": %s, \"search_seconds\": %.3f, \"cost_us\": %.3f, "
				"\"unfused_cost_us\": %.3f, \"kernels\": %d,\n     \"verification\": "
				"{\"trials\": %d, \"error_bound\": %.3g, \"degree\": %d, \"float_max_rel\": "
				"%.3g, \"float_max_abs\": %.3g}", s->cached ? "true" : "false",
				s->r.stats.seconds, s->r.cost_best.us, s->r.cost_unfused.us,
				s->r.best->n_ops, v->trials_run, v->error_bound, v->degree, v->float_max_rel,
				v->float_max_abs);
			if (s->fused)
				fprintf(f, ",\n     \"cpu_kernel_check\": {\"max_rel\": %.3g, \"max_abs\": %.3g, "
					"\"plans\": %d}", s->check.max_rel, s->check.max_abs, s->check.plans);
			if (s->fused && s->rows > 0) { /* served at any number of rows */
				fprintf(f, ",\n     \"rows\": {\"per_launch\": %lld, \"proven_at\": "
					"[%lld, %lld], \"field_trials\": %d, \"checked_at\": [{\"rows\": %lld, "
					"\"max_rel\": %.3g}, {\"rows\": %lld, \"max_rel\": %.3g}],\n      "
					"\"sizes\": [{\"per_launch\": %lld, \"cost_us\": %.3f, "
					"\"unfused_cost_us\": %.3f}",
					(long long)s->rows, (long long)s->rows_probe, (long long)s->rows_one,
					s->rows_trials, (long long)s->rows_probe, s->check_probe.max_rel,
					(long long)s->rows_one, s->check_one.max_rel, (long long)s->rows,
					s->r.cost_best.us, s->r.cost_unfused.us);
				for (int k = 0; k < s->n_sizes; k++)
					fprintf(f, ", {\"per_launch\": %lld, \"cost_us\": %.3f, "
						"\"unfused_cost_us\": %.3f}", (long long)s->size_rows[k],
						s->size_us[k], s->size_unfused_us[k]);
				fputs("], \"sizes_left_out\": [", f);
				bool first = true;
				for (int m = 0; m < s->n_more; m++) {
					if (!s->more_rows[m] || !s->more_why[m][0])
						continue;
					fprintf(f, "%s{\"per_launch\": %lld, \"why\": ", first ? "" : ", ",
						(long long)s->more_rows[m]);
					mo_json_string(f, s->more_why[m]);
					fputc('}', f);
					first = false;
				}
				fputs("]}", f);
			}
			if (s->fused && s->padded)
				write_padded(f, s);
			if (s->profile_n) { /* us[0]: the cost model's choice */
				fputs(",\n     \"profile\": {\"gpu\": ", f);
				mo_json_string(f, s->profile_gpu);
				fputs(", \"us\": [", f);
				for (int k = 0; k < s->profile_n; k++)
					if (s->profile_us[k] >= 0)
						fprintf(f, "%s%.3f", k ? ", " : "", s->profile_us[k]);
					else
						fprintf(f, "%snull", k ? ", " : "");
				fprintf(f, "], \"kept\": %d}", s->profile_kept);
			}
			write_variants(f, s, a);
			fputs(",\n     \"mugraph\": ", f);
			mo_mg_print_json(s->r.best, f);
		}
		fputc('}', f);
	}
	fputs("\n  ],\n  \"layers\": [", f);
	for (int l = 0; l <= ls->n; l++) { /* the whole model last, as "all" */
		const struct mo_fuse_layer *y = l < ls->n ? &ls->layer[l] : &ls->all;
		fprintf(f, "%s\n    {\"layer\": \"%s\", \"ops\": %d, \"fused_ops\": %d, "
			"\"float_ops\": %d, \"fused_float_ops\": %d, \"matmul_flops\": %.0f, "
			"\"fused_matmul_flops\": %.0f, \"matmuls_of_unknown_shape\": %d, "
			"\"custom_ops\": %d, \"kernels\": %d, \"modules\": [", l ? "," : "", y->name,
			y->ops, y->fused_ops, y->float_ops, y->fused_float_ops, y->matmul_flops,
			y->fused_matmul_flops, y->matmuls_unsized, y->custom_ops, y->kernels);
		for (int k = 0; k < y->n_modules; k++)
			fprintf(f, "%s{\"module\": \"%s\", \"ops\": %d, \"fused_ops\": %d, "
				"\"kernels\": %d}", k ? ", " : "", y->modules[k].name,
				y->modules[k].ops, y->modules[k].fused_ops, y->modules[k].kernels);
		fputs("]}", f);
	}
	fputs("\n  ]\n}\n", f);
	return fflush(f) == 0 && !ferror(f) && fsync(fileno(f)) == 0;
}
static const struct mo_tensor *tensor_named(const struct mo_tp *tp, const char *name)
{
	for (int t = 0; t < tp->n_tensors; t++)
		if (strcmp(tp->tensors[t].name, name) == 0)
			return &tp->tensors[t];
	return NULL;
}
/* Whether the μGraph's interface is the region's: every input and output a
 * tensor of the model with the same dtype and shape (a custom op declares
 * its types, and ONNX Runtime refuses a model where they do not match). */
static bool interface_matches(const struct mo_tp *tp, const struct mo_mugraph *mg,
			      char *why, size_t len)
{
	for (int io = 0; io < 2; io++) {
		int n = io ? mg->kg.n_outputs : mg->kg.n_inputs;
		for (int i = 0; i < n; i++) {
			const struct mo_tensor *k =
				&mg->kg.tensors[io ? mg->kg.outputs[i] : mg->kg.inputs[i]];
			const struct mo_tensor *t = tensor_named(tp, k->name);
			bool same = t && t->dtype == k->dtype && t->shape_known &&
				    t->rank == k->rank;
			for (int r = 0; same && r < k->rank; r++)
				same = t->dims[r] == k->dims[r];
			if (!same) {
				char a[72], b[72] = "nothing";
				mo_tensor_describe(k, a, sizeof a);
				if (t)
					mo_tensor_describe(t, b, sizeof b);
				snprintf(why, len, "the μGraph's %s '%.48s' is %s where the model has %s",
					 io ? "output" : "input", k->name, a, b);
				return false;
			}
		}
	}
	return true;
}
/* Folded value x as a constant a fused node reads (mo_fused_const). */
static struct mo_fused_const fused_const(const struct mo_tensor *x, bool outer)
{
	return (struct mo_fused_const){ .name = x->name, .dtype = x->dtype, .rank = x->rank,
					.dims = x->dims, .n = x->n_vals, .fvals = x->fvals,
					.ivals = x->ivals, .outer = outer, .sized = x->sized };
}

/* Whether regions a and b have an op in common. */
static bool shares_ops(const struct mo_region *a, const struct mo_region *b)
{
	for (int i = 0; i < a->n_ops; i++)
		for (int j = 0; j < b->n_ops; j++)
			if (a->ops[i] == b->ops[j])
				return true;
	return false;
}

/* Whether the μGraphs of units a and b read the same tensors, and make
 * the same, in any order. */
static bool same_io(const struct mo_fuse_region *a, const struct mo_fuse_region *b)
{
	const struct mo_tp *x = &a->r.best->kg, *y = &b->r.best->kg;
	if (x->n_inputs != y->n_inputs || x->n_outputs != y->n_outputs)
		return false;
	for (int i = 0; i < x->n_inputs + x->n_outputs; i++) {
		bool out = i >= x->n_inputs, found = false;
		const char *want = x->tensors[out ? x->outputs[i - x->n_inputs] : x->inputs[i]].name;
		for (int j = 0; j < (out ? y->n_outputs : y->n_inputs) && !found; j++)
			found = !strcmp(want, y->tensors[out ? y->outputs[j] : y->inputs[j]].name);
		if (!found)
			return false;
	}
	return true;
}

/* Whether t serves padded unit s's sizes past its buckets at level L as
 * one op: fused padded at that level over the same ops, reading and making
 * the same tensors. */
static bool serves_whole(const struct mo_fuse_region *s, const struct mo_fuse_region *t, int L)
{
	return t != s && t->fused && t->padded && t->r.best && t->level == L &&
	       t->rg->n_ops == s->rg->n_ops &&
	       !memcmp(t->rg->ops, s->rg->ops, sizeof *s->rg->ops * (size_t)s->rg->n_ops) &&
	       same_io(s, t);
}

int fuse_next_buckets(const struct mo_fuse_region *rs, int nu, int u, int *w)
{
	const struct mo_fuse_region *s = &rs[u];
	if (!s->fused || !s->padded || !s->r.best)
		return 0;
	for (int L = s->level + 1; L < FUSE_DYN_MAX_LEVELS; L++) {
		for (int t = 0; t < nu; t++)
			if (serves_whole(s, &rs[t], L)) {
				w[0] = t;
				return 1;
			}
		/* a whole region whose copy at L fused in parts: those */
		int copy = -1;
		for (int t = 0; t < nu && s->parent < 0 && copy < 0; t++)
			if (rs[t].parent < 0 && rs[t].rg == s->rg && rs[t].level == L && !rs[t].fused)
				copy = t;
		int n = 0;
		for (int t = 0; t < nu && copy >= 0; t++)
			if (rs[t].parent == copy && rs[t].fused && rs[t].padded && rs[t].r.best)
				w[n++] = t;
		if (n > 0)
			return n;
	}
	return 0;
}

bool fuse_is_next_bucket(const struct mo_fuse_region *rs, int nu, int w)
{
	int *list = mo_malloc(sizeof *list * ((size_t)nu + 1));
	bool found = false;
	for (int u = 0; list && u < nu && !found; u++) {
		int n = u != w ? fuse_next_buckets(rs, nu, u, list) : 0;
		for (int k = 0; k < n && !found; k++)
			found = list[k] == w;
	}
	mo_free(list);
	return found;
}

/* Whether x is among v[0..n). */
static bool has_int(const int *v, int n, int x)
{
	for (int i = 0; i < n; i++)
		if (v[i] == x)
			return true;
	return false;
}

/* The fused node of unit u (nodes, inputs and outputs malloc'ed into f;
 * with `fallback`, the node of its next bucket's unit as f->next). */
bool fuse_fused_node_of(const struct mo_tp *tp, const struct mo_fuse_region *rs, int nu, int u,
			  bool fallback, char *name, size_t name_len, struct mo_fused_node *f)
{
	const struct mo_region *rg = rs[u].rg;
	const struct mo_mugraph *mg = rs[u].r.best;
	int *nodes = mo_malloc(sizeof *nodes * (size_t)(rg->n_ops + tp->n_nodes + 1));
	const char **ins = mo_malloc(sizeof *ins * (size_t)(mg->kg.n_inputs + 1));
	const char **outs = mo_malloc(sizeof *outs * (size_t)(mg->kg.n_outputs + 1));
	int n_readers = 0, *readers = mo_malloc(sizeof *readers * (size_t)(tp->n_nodes + 1));
	struct mo_fused_const *consts = NULL;
	if (!nodes || !ins || !outs || !readers)
		goto fail;
	int nn = 0;
	for (int i = 0; i < rg->n_ops; i++) {
		int node = tp->ops[rg->ops[i]].node;
		if (!has_int(nodes, nn, node))
			nodes[nn++] = node;
	}
	for (int i = 0; i < mg->kg.n_inputs; i++)
		ins[i] = mg->kg.tensors[mg->kg.inputs[i]].name;
	for (int i = 0; i < mg->kg.n_outputs; i++)
		outs[i] = mg->kg.tensors[mg->kg.outputs[i]].name;
	/* the folded readers (a Shape) of what the op keeps inside: it replaces
	 * them, and the fused model holds what they made (mo_part_folded_reader) */
	for (int i = 0; i < rg->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[rg->ops[i]];
		for (int k = 0; k < op->n_out; k++) {
			const struct mo_tensor *x = op->out[k] >= 0 ? &tp->tensors[op->out[k]] : NULL;
			bool kept = x != NULL;
			for (int q = 0; q < mg->kg.n_outputs && kept; q++)
				kept = strcmp(outs[q], x->name) != 0;
			for (int c = 0; kept && c < x->n_consumers; c++) {
				int node = x->consumers[c];
				if (mo_part_folded_reader(tp, node) &&
				    !has_int(readers, n_readers, node))
					readers[n_readers++] = node;
			}
		}
	}
	for (int q = 0; q < n_readers; q++)
		nodes[nn++] = readers[q];
	/* at sizes the tool chose, the folded nodes the partition put in the
	 * region (all they make is read inside it: a Shape of a tensor the op
	 * keeps inside and the shape arithmetic after it, rotate_half's
	 * `x.shape[-1] // 2`) go with it: the μGraph holds what they made
	 * where it is the same at every size, the fallback and the function
	 * body compute it */
	int n_with = nn;
	for (int i = 0; tp->sizes_chosen && i < rg->n_nodes; i++) {
		int node = rg->nodes[i];
		if (tp->node_op[node] < 0 && !has_int(nodes, nn, node))
			nodes[nn++] = node;
	}
	/* but not those making what the op reads (an Identity of a shared
	 * weight), nor what they read: they stay in the graph */
	for (bool changed = nn > n_with; changed;) {
		changed = false;
		for (int t = 0; t < tp->n_tensors; t++) {
			const struct mo_tensor *x = &tp->tensors[t];
			int k = n_with;
			while (k < nn && nodes[k] != x->source_node)
				k++;
			if (k == nn)
				continue;
			bool needed = false;
			for (int i = 0; i < mg->kg.n_inputs && !needed; i++)
				needed = strcmp(ins[i], x->name) == 0;
			for (int c = 0; c < x->n_consumers && !needed; c++)
				needed = !has_int(nodes, nn, x->consumers[c]); /* read by one staying out */
			if (needed) {
				nodes[k] = nodes[--nn];
				changed = true;
			}
		}
	}
	/* the folded values its ops read (each once), for its function body,
	 * and what its folded readers made */
	int nc = 0, cap = 0;
	for (int i = 0; i < rg->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[rg->ops[i]];
		cap += op->n_in + op->n_params;
	}
	for (int t = 0; t < tp->n_tensors && n_readers > 0; t++)
		for (int q = 0; q < n_readers; q++) {
			cap += tp->tensors[t].source_node == readers[q];
			for (int c = 0; c < tp->tensors[t].n_consumers; c++)
				cap += tp->tensors[t].consumers[c] == readers[q];
		}
	consts = mo_calloc((size_t)cap + 1, sizeof *consts);
	if (!consts)
		goto fail;
	for (int i = 0; i < rg->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[rg->ops[i]];
		for (int k = 0; k < op->n_in + op->n_params; k++) {
			int t = k < op->n_in ? op->in[k] : op->param_in[k - op->n_in];
			const struct mo_tensor *x = t >= 0 ? &tp->tensors[t] : NULL;
			if (!x || x->kind != MO_T_CONST || x->init || !x->shape_known ||
			    (!x->fvals && !x->ivals) || x->n_vals != mo_tensor_numel(x))
				continue;
			/* a decomposition's own constant (Attention's scale) lives
			 * inside its node, which the body holds as it is; when
			 * the fused op reads it as an input, the fused graph
			 * holds it */
			bool inside = false, input = false;
			for (int q = 0; q < nn && !inside; q++)
				inside = x->source_node == nodes[q];
			for (int q = 0; q < mg->kg.n_inputs && inside && !input; q++)
				input = strcmp(ins[q], x->name) == 0;
			if (inside && !input)
				continue;
			bool seen = false;
			for (int q = 0; q < nc && !seen; q++)
				seen = strcmp(consts[q].name, x->name) == 0;
			if (!seen)
				consts[nc++] = fused_const(x, inside);
		}
	}
	/* and the folded values those readers read besides (an empty Slice's
	 * starts), which the body defines */
	for (int t = 0; t < tp->n_tensors && n_readers > 0; t++) {
		const struct mo_tensor *x = &tp->tensors[t];
		bool read = false;
		for (int c = 0; c < x->n_consumers && !read; c++)
			for (int q = 0; q < n_readers && !read; q++)
				read = x->consumers[c] == readers[q];
		if (!read || x->kind != MO_T_CONST || x->init || !x->shape_known ||
		    (!x->fvals && !x->ivals) || x->n_vals != mo_tensor_numel(x))
			continue;
		bool seen = false;
		for (int q = 0; q < nc && !seen; q++)
			seen = strcmp(consts[q].name, x->name) == 0;
		if (!seen && nc < cap)
			consts[nc++] = fused_const(x, false);
	}
	for (int t = 0; t < tp->n_tensors && n_readers > 0; t++) {
		const struct mo_tensor *x = &tp->tensors[t];
		bool mine = false;
		for (int q = 0; q < n_readers && !mine; q++)
			mine = x->source_node == readers[q];
		bool seen = false;
		for (int q = 0; q < nc && mine && !seen; q++)
			seen = strcmp(consts[q].name, x->name) == 0;
		if (mine && !seen)
			consts[nc++] = fused_const(x, true);
	}
	mo_free(readers);
	/* a padded op serves its padded dims up to their buckets: past them,
	 * the fused model runs the original ops (mo_fused_node.guards) */
	const struct mo_fuse_region *r = &rs[u];
	int n_guards = 0;
	struct mo_fused_guard *guards = NULL;
	int32_t *out_dtypes = NULL;
	if (fallback && r->padded && r->in_ext) {
		guards = mo_calloc((size_t)mg->kg.n_inputs * MO_PLUGIN_MAX_RANK + 1, sizeof *guards);
		out_dtypes = mo_calloc((size_t)mg->kg.n_outputs + 1, sizeof *out_dtypes);
		if (!guards || !out_dtypes) {
			mo_free(guards);
			mo_free(out_dtypes);
			mo_free(consts);
			readers = NULL; /* freed above */
			goto fail;
		}
		for (int i = 0; i < mg->kg.n_inputs; i++)
			for (int d = 0; d < mg->kg.tensors[mg->kg.inputs[i]].rank; d++) {
				int e = r->in_ext[i * MO_PLUGIN_MAX_RANK + d];
				if (e >= 0 && !r->ext_loop[e])
					guards[n_guards++] = (struct mo_fused_guard){
						.input = i, .axis = d, .most = r->ext_bucket[e] };
			}
		for (int i = 0; i < mg->kg.n_outputs; i++)
			out_dtypes[i] = mg->kg.tensors[mg->kg.outputs[i]].dtype;
	}
	char lb[32];
	snprintf(name, name_len, "%s_region%s", rs[u].op_type, fuse_label(rs, u, lb, sizeof lb));
	*f = (struct mo_fused_node){ .op_type = rs[u].op_type, .name = name, .n_nodes = nn,
				     .nodes = nodes, .n_inputs = mg->kg.n_inputs,
				     .n_outputs = mg->kg.n_outputs, .inputs = ins, .outputs = outs,
				     .n_consts = nc, .consts = consts, .n_guards = n_guards,
				     .guards = guards, .out_dtypes = out_dtypes };
	/* past its buckets, the next bucket's ops (their nodes and names in
	 * one block, freed with f) */
	int *w = n_guards > 0 ? mo_malloc(sizeof *w * ((size_t)nu + 1)) : NULL;
	int n_next = w ? fuse_next_buckets(rs, nu, u, w) : 0;
	if (n_guards > 0 && !w) {
		fuse_fused_node_free(f);
		return false;
	}
	if (n_next > 0) {
		struct mo_fused_node *nx = mo_calloc((size_t)n_next, sizeof *nx + 80);
		char *nx_names = nx ? (char *)(nx + n_next) : NULL;
		int made = 0;
		while (nx && made < n_next &&
		       fuse_fused_node_of(tp, rs, nu, w[made], fallback, nx_names + 80 * made, 80,
					  &nx[made]))
			made++;
		f->next = nx;
		f->n_next = made;
		if (made < n_next) {
			mo_free(w);
			fuse_fused_node_free(f);
			return false;
		}
	}
	mo_free(w);
	return true;
fail:
	mo_free(nodes);
	mo_free(ins);
	mo_free(outs);
	mo_free(readers);
	return false;
}
/* The most elements of a folded value the fused model may hold in place of
 * the node making it (mo_export_options.folded): shapes and their
 * arithmetic, not masks the size of an attention's scores. */
#define MAX_HELD 4096

/* The values the importer folded whole that nodes making no op made
 * (mo_export_options.folded), or NULL with *n = 0 (none, or out of
 * memory: the export then holds none). At sizes the tool chose, only those
 * the same at every size the model was imported at (not sized: a head
 * dim's scale computed from a Shape of the queries, which a part of the
 * attention fused would otherwise read through that Shape of what it
 * makes, a cycle); none when that is not known. Free with mo_free. */
static struct mo_fused_const *folded_values(const struct mo_tp *tp, size_t *n)
{
	*n = 0;
	if (tp->sizes_chosen && !tp->sized_known)
		return NULL;
	struct mo_fused_const *v = mo_calloc((size_t)tp->n_tensors + 1, sizeof *v);
	for (int t = 0; v && t < tp->n_tensors; t++) {
		const struct mo_tensor *x = &tp->tensors[t];
		int node = x->source_node;
		if (x->kind != MO_T_CONST || x->init || !x->shape_known || x->is_graph_output ||
		    (!x->fvals && !x->ivals) || x->n_vals != mo_tensor_numel(x) ||
		    x->n_vals > MAX_HELD || node < 0 || node >= tp->n_nodes || tp->node_op[node] >= 0 ||
		    (tp->sizes_chosen && x->sized))
			continue;
		v[(*n)++] = fused_const(x, false);
	}
	return v;
}

void fuse_fused_node_free(struct mo_fused_node *f)
{
	if (f->next) {
		struct mo_fused_node *nx = (struct mo_fused_node *)f->next;
		for (int i = 0; i < f->n_next; i++)
			fuse_fused_node_free(&nx[i]);
		mo_free(nx);
		f->next = NULL;
		f->n_next = 0;
	}
	mo_free((void *)f->nodes);
	mo_free((void *)f->inputs);
	mo_free((void *)f->outputs);
	mo_free((void *)f->consts);
	mo_free((void *)f->guards);
	mo_free((void *)f->out_dtypes);
}
/* mo_export_options.no_function for fuse_keep_exportable: every unit of
 * that op type is marked. */
struct unit_list {
	struct mo_fuse_region *rs;
	int nu;
};
static void mark_no_function(void *ctx, const char *op_type)
{
	struct unit_list *ul = ctx;
	for (int u = 0; u < ul->nu; u++)
		if (!strcmp(ul->rs[u].op_type, op_type))
			ul->rs[u].no_function = true;
}

/* Leaves unfused, with the reason, every found unit whose μGraph does not
 * fit the model: its interface differs from the region's, or the model
 * would not export with it (a tensor it makes still read elsewhere, a
 * cycle with the units kept before it). The units kept export together,
 * so one region's misfit never costs the others their fusion. Each check
 * marks the units whose op the model will hold no function body for
 * (mo_fuse_region.no_function; a kept unit's own check marks it). */
enum mo_status fuse_keep_exportable(struct mo_model *m, const struct mo_fuse_options *a,
				    const struct mo_tp *tp, const struct fuse_dyn *y,
				    struct mo_fuse_region *rs, int nu)
{
	struct mo_fused_node *fn = mo_calloc((size_t)nu + 1, sizeof *fn);
	char (*names)[80] = mo_calloc((size_t)nu + 1, sizeof *names);
	size_t n_folded;
	struct mo_fused_const *folded = folded_values(tp, &n_folded);
	/* the units in order, then those skipped as a larger bucket of a unit
	 * that did not export */
	bool *skipped = mo_calloc((size_t)nu + 1, sizeof *skipped);
	int *next = mo_calloc((size_t)nu + 1, sizeof *next);
	int *kept = mo_calloc((size_t)nu + 1, sizeof *kept); /* per fn[k]: its unit */
	enum mo_status st = MO_OK;
	int nf = 0;
	struct unit_list ul = { rs, nu };
	for (int u = 0; u < nu; u++)
		rs[u].no_function = false;
	if (!fn || !names || !skipped || !next || !kept) {
		st = MO_ERR_NOMEM;
		goto out;
	}
	for (int it = 0; it < 2 * nu; it++) {
		int u = it % nu;
		struct mo_fuse_region *s = &rs[u];
		if (!s->fused || (it >= nu && !skipped[u]))
			continue;
		/* a larger bucket's op: exported inside the smaller's If, or,
		 * with --no-fallback (no If), not at all */
		if (fuse_is_next_bucket(rs, nu, u)) {
			skipped[u] = true;
			if (!a->no_fallback)
				continue;
			s->fused = false;
			snprintf(s->why, sizeof s->why, "not used: --no-fallback writes a region's "
				 "smallest bucket alone");
			continue;
		}
		char why[300] = "";
		/* its larger buckets' μGraphs must fit too: one that does not
		 * stays unfused, and the others (or the next bucket's) are tried
		 * in its place */
		for (bool again = !a->no_fallback; again;) {
			int n = fuse_next_buckets(rs, nu, u, next);
			again = false;
			for (int k = 0; k < n && !again; k++) {
				int w = next[k];
				if (interface_matches(rs[w].prog, rs[w].r.best, why, sizeof why))
					continue;
				snprintf(rs[w].why, sizeof rs[w].why, "export: %s", why);
				rs[w].fused = false;
				char lb[32];
				fuse_warn(a, "region %s stays unfused: %s",
					  fuse_label(rs, w, lb, sizeof lb), rs[w].why);
				why[0] = '\0';
				again = true;
			}
		}
		/* another bucket's unit over some of its ops kept already (a
		 * whole region's bucket and another's part, neither in the
		 * other's chain): said so, not as a node claimed twice */
		int other = -1;
		for (int k = 0; k < nf && s->padded && other < 0; k++)
			if (rs[kept[k]].padded && rs[kept[k]].level != s->level &&
			    shares_ops(rs[kept[k]].rg, s->rg))
				other = kept[k];
		/* a padded one's μGraph is its program's at the bucket */
		if (other >= 0) {
			char lb[32];
			snprintf(s->why, sizeof s->why, "its ops are fused at another bucket already "
				 "(region %s): a bucket's parts serve only under the whole region's "
				 "smaller bucket", fuse_label(rs, other, lb, sizeof lb));
		} else if (!interface_matches(s->padded ? s->prog : tp, s->r.best, why, sizeof why)) {
			snprintf(s->why, sizeof s->why, "export: %s", why);
		} else if (!fuse_fused_node_of(tp, rs, nu, u, !a->no_fallback, names[nf], sizeof names[nf],
					       &fn[nf])) {
			st = MO_ERR_NOMEM;
			goto out;
		} else {
			/* a check only: the build, and so the domain, come later;
			 * it says which op types the model will hold no function
			 * body for (mo_cg_op.cpu_always) */
			struct mo_export_options eo = { .domain = MO_PLUGIN_DOMAIN_PREFIX,
							.folded = folded, .n_folded = n_folded,
							.n_shape_sources = y->n_shape_src,
							.shape_sources = y->shape_src,
							.no_function = mark_no_function,
							.no_function_ctx = &ul };
			struct mo_diag xd;
			mo_diag_init(&xd);
			if (fuse_injected_failure(rs, u, "export"))
				mo_diag_set(&xd, MO_ERR_INTERNAL, "injected failure (test)");
			else
				mo_export(m, fn, nf + 1, &eo, NULL, &xd);
			if (xd.status == MO_ERR_NOMEM) {
				fuse_fused_node_free(&fn[nf]);
				st = MO_ERR_NOMEM;
				goto out;
			}
			if (xd.status == MO_OK) {
				kept[nf++] = u;
				continue;
			}
			fuse_fused_node_free(&fn[nf]);
			const char *msg = strncmp(xd.msg, "export: ", 8) ? xd.msg : xd.msg + 8;
			snprintf(s->why, sizeof s->why, "export: %.350s", msg);
		}
		s->fused = false;
		char lb[32];
		fuse_warn(a, "region %s stays unfused: %s",
			  fuse_label(rs, u, lb, sizeof lb), s->why);
	}
out:
	for (int k = 0; fn && k < nf; k++)
		fuse_fused_node_free(&fn[k]);
	mo_free(fn);
	mo_free(names);
	mo_free(skipped);
	mo_free(next);
	mo_free(kept);
	mo_free(folded);
	return st;
}
/* ---- the file set: OUT, OUT.mirage.<id>.so, OUT.mirage.<id>.json ----
 *
 * The plugin and manifest names carry the build id and OUT's metadata names
 * them, so the new set's files never overwrite the old set's (but for the
 * same build, whose files are equivalent). Everything is written to
 * temporary files in OUT's folder first; then the plugin and manifest are
 * renamed to their names, then the model over OUT, the one step that
 * switches from the old set to the new; only then are the old set's plugin
 * and manifest removed. A run that fails or is killed at any point leaves
 * OUT with the plugin and manifest it names. */
/* The hidden test hook MO_TEST_FILESET_FAULT=STAGE:fail|kill: at STAGE the
 * step fails as on a full disk, or the process dies (SIGKILL), so a test can
 * prove the property at every step. */
static bool fault(const char *stage)
{
	const char *f = getenv("MO_TEST_FILESET_FAULT");
	size_t n = strlen(stage);
	if (!f || strncmp(f, stage, n) != 0 || f[n] != ':')
		return false;
	if (strcmp(f + n + 1, "kill") == 0)
		raise(SIGKILL);
	errno = ENOSPC;
	return true;
}
static bool sync_file(const char *path)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return false;
	bool ok = fsync(fd) == 0;
	int e = errno;
	close(fd);
	errno = e;
	return ok;
}
/* Is name "<stem>.mirage.<16 hex digits>.so|.json" (a set's plugin or
 * manifest) or the unversioned "<stem>.mirage.so|.json" of older versions? */
static bool set_file_of(const char *name, const char *stem)
{
	size_t n = strlen(stem);
	if (strncmp(name, stem, n) != 0 || strncmp(name + n, ".mirage.", 8) != 0)
		return false;
	const char *p = name + n + 8;
	if (strcmp(p, "so") == 0 || strcmp(p, "json") == 0)
		return true;
	for (int i = 0; i < MO_PLUGIN_BUILD_ID_LEN; i++, p++)
		if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
			return false;
	return strcmp(p, ".so") == 0 || strcmp(p, ".json") == 0;
}
/* Is path the model this run reads, or one of its external data files? */
static bool is_input(const struct mo_model *m, const struct mo_fuse_options *a, const char *path)
{
	if (mo_same_file(path, a->in_path))
		return true;
	size_t ne = mo_onnx_dir(m) ? mo_onnx_external_file_count(m) : 0;
	for (size_t i = 0; i < ne; i++) {
		char in[8500];
		snprintf(in, sizeof in, "%s/%s", mo_onnx_dir(m), mo_onnx_external_file(m, i));
		if (mo_same_file(path, in))
			return true;
	}
	return false;
}
/* Removes every plugin and manifest of OUT's earlier sets but keep[] (and
 * never an input of this run); false (errno set) when one could not go. */
static bool remove_old_sets(const struct mo_model *m, const struct mo_fuse_options *a,
			    const char *const keep[2])
{
	const char *out = a->out_path;
	char dir[4200], stem[4200], path[8500];
	const char *b = fuse_base_name(out);
	snprintf(dir, sizeof dir, "%.*s", b > out ? (int)(b - out) : 1, b > out ? out : ".");
	mo_fuse_beside(b, "", stem, sizeof stem);
	DIR *dh = opendir(dir);
	if (!dh)
		return false;
	bool ok = true;
	int e = 0;
	struct dirent *de;
	while ((de = readdir(dh))) {
		if (!set_file_of(de->d_name, stem))
			continue;
		if ((keep[0] && !strcmp(de->d_name, keep[0])) || (keep[1] && !strcmp(de->d_name, keep[1])))
			continue;
		snprintf(path, sizeof path, "%.*s%s", (int)(b - out), out, de->d_name);
		if (is_input(m, a, path))
			continue;
		if (unlink(path) != 0 && errno != ENOENT) {
			ok = false;
			e = errno;
		}
	}
	closedir(dh);
	errno = e;
	return ok;
}
/* Renames tmp to dest, unless dest is an input of this run; false with d set. */
static bool rename_into(const struct mo_model *m, const struct mo_fuse_options *a, const char *tmp,
			const char *dest, const char *stage, struct mo_diag *d)
{
	if (is_input(m, a, dest)) {
		mo_diag_set(d, MO_ERR_INPUT, "%s: is an input of this run; choose another -o", dest);
		return false;
	}
	if (fault(stage) || rename(tmp, dest) != 0) {
		mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", dest, strerror(errno));
		return false;
	}
	mo_cleanup_remove_path(tmp);
	return true;
}

/* Writes the set (see above), recording what it wrote in rep. */
enum mo_status fuse_write_set(struct mo_model *m, const struct mo_fuse_options *a,
			      const struct mo_tp *tp, int nu, const struct mo_fuse_region *rs,
			      const struct fuse_file_set *fs, struct mo_fuse_report *rep,
			      struct mo_diag *d)
{
	const char *out = a->out_path;
	char so[4200] = "", manifest[4200] = "", domain[64] = "", suffix[64];
	char *man_tmp = NULL, *model_tmp = NULL;
	bool fused = fs->nf > 0 && fs->so_tmp;
	bool so_renamed = false, man_renamed = false, so_existed = false, man_existed = false;
	struct stat sb;
	enum mo_status st;
	if (fused) {
		mo_plugin_domain_of(fs->id, domain, sizeof domain);
		snprintf(suffix, sizeof suffix, ".mirage.%s.so", fs->id);
		mo_fuse_beside(out, suffix, so, sizeof so);
		snprintf(suffix, sizeof suffix, ".mirage.%s.json", fs->id);
		mo_fuse_beside(out, suffix, manifest, sizeof manifest);
		/* the plugin, as built */
		if (!sync_file(fs->so_tmp) || fault("plugin")) {
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", so, strerror(errno));
			goto undo;
		}
		/* the manifest */
		int fd = mo_file_create_temp(manifest, &man_tmp, d);
		if (fd < 0)
			goto undo;
		FILE *f = fdopen(fd, "w");
		bool ok = f && write_manifest(f, a->in_path, fuse_base_name(so), domain, fs->id, tp, nu, rs,
					      a, fs->dynamic, fs->readings, &rep->layers);
		int e = errno;
		if (f && fclose(f) != 0 && ok) {
			ok = false;
			e = errno;
		} else if (!f) {
			close(fd);
		}
		if (ok && fault("manifest")) {
			ok = false;
			e = errno;
		}
		if (!ok) {
			mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write the manifest: %s", manifest,
				    strerror(e));
			goto undo;
		}
	}
	/* the model: mo_export writes it whole (its own temporary file and
	 * rename) to a temporary name of ours */
	int fd = mo_file_create_temp(out, &model_tmp, d);
	if (fd < 0)
		goto undo;
	close(fd);
	char *shapes = input_shapes_json(tp);
	if (!shapes) {
		mo_diag_nomem(d);
		goto undo;
	}
	size_t n_folded;
	struct mo_fused_const *folded = folded_values(tp, &n_folded);
	const char *reading_of[MO_IMPORT_MAX_READINGS], *read_as[MO_IMPORT_MAX_READINGS];
	int n_readings = fs->readings ? fs->readings->n : 0;
	for (int k = 0; k < n_readings; k++) {
		reading_of[k] = fs->readings->reading_of[k];
		read_as[k] = fs->readings->read_as[k];
	}
	struct mo_export_options eo = { .domain = domain, .plugin_file = fuse_base_name(so),
					.manifest_file = fuse_base_name(manifest), .build_id = fs->id,
					.input_shapes = shapes, .folded = folded,
					.n_folded = n_folded, .n_readings = n_readings,
					.reading_of = reading_of, .read_as = read_as,
					.n_shape_sources = fs->n_shape_src,
					.shape_sources = fs->shape_src };
	st = fused ? mo_export(m, fs->fn, fs->nf, &eo, model_tmp, d)
				  : mo_onnx_save(m, model_tmp, d);
	free(shapes);
	mo_free(folded);
	if (!st && fault("model"))
		st = mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", model_tmp, strerror(errno));
	if (st) {
		/* the message names our temporary file: name OUT instead */
		size_t n = strlen(model_tmp);
		if (strncmp(d->msg, model_tmp, n) == 0) {
			char msg[sizeof d->msg];
			snprintf(msg, sizeof msg, "%s%s", out, d->msg + n);
			snprintf(d->msg, sizeof d->msg, "%s", msg);
		}
		goto undo;
	}
	/* the renames: the plugin and manifest first, under names the old set
	 * does not use (or, for the same build, equivalent files) */
	if (fused) {
		so_existed = stat(so, &sb) == 0;
		if (!rename_into(m, a, fs->so_tmp, so, "rename-plugin", d))
			goto undo;
		so_renamed = true;
		man_existed = stat(manifest, &sb) == 0;
		if (!rename_into(m, a, man_tmp, manifest, "rename-manifest", d))
			goto undo;
		man_renamed = true;
	}
	/* the switch to the new set (OUT is no input: main.c checked) */
	if (!rename_into(m, a, model_tmp, out, "rename-model", d))
		goto undo;
	mo_free(model_tmp);
	mo_free(man_tmp);
	/* the old set's plugin and manifest; what cannot go is only a warning */
	const char *keep[2] = { fused ? fuse_base_name(so) : NULL, fused ? fuse_base_name(manifest) : NULL };
	if (fault("cleanup") || !remove_old_sets(m, a, keep))
		fuse_warn(a, "%s: cannot remove the previous run's plugin "
			  "and manifest: %s", out, strerror(errno));
	rep->written = true;
	rep->n_fused = 0;
	for (int k = 0; k < fs->nf; k++)
		rep->n_fused += fused_ops_in(&fs->fn[k]);
	if (fused) {
		snprintf(rep->plugin, sizeof rep->plugin, "%s", so);
		snprintf(rep->manifest, sizeof rep->manifest, "%s", manifest);
		snprintf(rep->domain, sizeof rep->domain, "%s", domain);
	}
	return MO_OK;
undo:
	if (so_renamed && !so_existed)
		unlink(so);
	if (man_renamed) {
		if (!man_existed)
			unlink(manifest);
		mo_free(man_tmp);
	} else {
		mo_file_discard_temp(-1, man_tmp);
	}
	mo_file_discard_temp(-1, model_tmp);
	return d->status ? d->status : MO_ERR_INTERNAL;
}
