/* --list-regions as text and JSON, and --dot. */
#include "mo_part.h"

#include <inttypes.h>
#include <string.h>

#define WIDTH 100

static const char *node_op_type(const struct mo_tp *tp, int node)
{
	const char *t = mo_onnx_proto(tp->model)->graph->node[node]->op_type;
	return t ? t : "";
}

static void human(uint64_t n, const char *unit, char *buf, size_t len)
{
	static const char *si[] = { "", "K", "M", "G", "T", "P" };
	double v = (double)n;
	int k = 0;
	while (v >= 1000 && k < 5) {
		v /= 1000;
		k++;
	}
	snprintf(buf, len, k ? "%.1f %s%s" : "%.0f %s%s", v, si[k], unit);
}

/* Prints items separated by ", ", wrapped under an indented label. */
static void wrapped(FILE *out, const char *label, const char *const *items, int n)
{
	int col = fprintf(out, "    %-8s", label);
	for (int i = 0; i < n; i++) {
		int len = (int)strlen(items[i]) + 2;
		if (i)
			col += fprintf(out, ",");
		if (col + len > WIDTH && col > 12) {
			fprintf(out, "\n    %-8s", "");
			col = 12;
		} else if (i) {
			col += fprintf(out, " ");
		}
		col += fprintf(out, "%s", items[i]);
	}
	fputc('\n', out);
}

static void tensor_items(const struct mo_tp *tp, const int *ts, int n, char (*buf)[160],
			 const char **items)
{
	for (int i = 0; i < n; i++) {
		const struct mo_tensor *t = &tp->tensors[ts[i]];
		char shape[120];
		mo_tensor_describe(t, shape, sizeof shape);
		snprintf(buf[i], sizeof buf[i], "%s %s", t->name, shape);
		items[i] = buf[i];
	}
}

/* The symbolic dimensions of the inputs and their values: "batch_size = 2
 * (--dim), past = unbound". */
static void print_symbols(const struct mo_tp *tp, FILE *out)
{
	const char *lead = "symbols    ";
	for (int i = 0; i < tp->n_syms; i++) {
		const struct mo_tp_sym *s = &tp->syms[i];
		if (!s->in_input && !s->whole_text)
			continue;
		if (s->bound)
			fprintf(out, "%s%s = %" PRId64 " (%s)", lead, s->name, s->value, s->how);
		else
			fprintf(out, "%s%s unbound", lead, s->name);
		lead = "\n           ";
	}
	if (*lead == '\n')
		fputc('\n', out);
}

/* The i-th region of p, then of pad (the padded ones, numbered after p's
 * as the fuse numbers them), or NULL past the last. */
static const struct mo_region *nth_region(const struct mo_partition *p,
					  const struct mo_partition *pad, int i)
{
	if (i < p->n_regions)
		return &p->regions[i];
	i -= p->n_regions;
	return pad && i < pad->n_regions ? &pad->regions[i] : NULL;
}

/* Whether op i is in a region of p or of pad. */
static bool in_region(const struct mo_partition *p, const struct mo_partition *pad, int i)
{
	return p->op_region[i] >= 0 || (pad && pad->op_region[i] >= 0);
}

void mo_part_print(const struct mo_tp *tp, const struct mo_partition *p,
		   const struct mo_partition *pad, FILE *out)
{
	print_symbols(tp, out);
	int in_regions = 0, fusable = 0, n_pad = pad ? pad->n_regions : 0;
	for (int i = 0; i < tp->n_ops; i++) {
		in_regions += in_region(p, pad, i);
		fusable += tp->ops[i].lax != MO_LAX_NONE || (pad && pad->op_region[i] >= 0);
	}
	fprintf(out, "%d region%s", p->n_regions + n_pad, p->n_regions + n_pad == 1 ? "" : "s");
	if (n_pad)
		fprintf(out, " (%d padded)", n_pad);
	fprintf(out, ": %d of %d ops (%d fusable)\n", in_regions, tp->n_ops, fusable);
	const struct mo_region *r;
	for (int ri = 0; (r = nth_region(p, pad, ri)); ri++) {
		char fl[32], bf[32], bu[32];
		human(r->flops, "FLOP", fl, sizeof fl);
		human(r->bytes_fused, "B", bf, sizeof bf);
		human(r->bytes_unfused, "B", bu, sizeof bu);
		fprintf(out, "\nregion %d%s: %d ops, %d exp%s on the longest path, "
			"%d MatMul%s chained, %s, %s moved fused vs %s unfused\n",
			ri + 1, ri < p->n_regions ? "" : " (padded: its dims that vary padded to a bucket)",
			r->n_ops, r->exps, r->exps == 1 ? "" : "s", r->matmul_chain,
			r->matmul_chain == 1 ? "" : "s", fl, bf, bu);
		int m = r->n_nodes > r->n_inputs ? r->n_nodes : r->n_inputs;
		if (r->n_outputs > m)
			m = r->n_outputs;
		const char **items = mo_calloc((size_t)m + 1, sizeof *items);
		char(*buf)[160] = mo_calloc((size_t)m + 1, sizeof *buf);
		if (!items || !buf) {
			mo_free(items);
			mo_free(buf);
			fputs("    (out of memory)\n", out);
			continue;
		}
		for (int i = 0; i < r->n_nodes; i++) {
			snprintf(buf[i], sizeof buf[i], "%s (%s)", tp->node_names[r->nodes[i]],
				 node_op_type(tp, r->nodes[i]));
			items[i] = buf[i];
		}
		wrapped(out, "nodes", items, r->n_nodes);
		tensor_items(tp, r->inputs, r->n_inputs, buf, items);
		wrapped(out, "inputs", items, r->n_inputs);
		tensor_items(tp, r->outputs, r->n_outputs, buf, items);
		wrapped(out, "outputs", items, r->n_outputs);
		mo_free(items);
		mo_free(buf);
	}
	/* Why the rest is not fused, one line per reason. */
	bool header = false;
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		if (op->lax != MO_LAX_NONE || !op->note || in_region(p, pad, i))
			continue;
		bool seen = false;
		for (int j = 0; j < i && !seen; j++)
			seen = tp->ops[j].lax == MO_LAX_NONE && tp->ops[j].note &&
			       !in_region(p, pad, j) && strcmp(tp->ops[j].note, op->note) == 0;
		if (seen)
			continue;
		if (!header)
			fputs("\nnot fused:\n", out);
		header = true;
		int count = 0, shown = 0, col = fprintf(out, "    %s:", op->note);
		for (int j = i; j < tp->n_ops; j++) {
			const struct mo_tp_op *o = &tp->ops[j];
			if (o->lax != MO_LAX_NONE || !o->note || in_region(p, pad, j) ||
			    strcmp(o->note, op->note))
				continue;
			if (++count > 6)
				continue;
			const char *name = tp->node_names[o->node];
			const char *type = node_op_type(tp, o->node);
			if (col + (int)(strlen(name) + strlen(type)) + 4 > WIDTH) /* on a line of its own */
				col = fprintf(out, "\n       ");
			col += fprintf(out, " %s (%s)", name, type);
			shown++;
		}
		if (count > shown)
			fprintf(out, " and %d more", count - shown);
		fputc('\n', out);
	}
}

static void json_tensors(const struct mo_tp *tp, const int *ts, int n, FILE *out)
{
	fputc('[', out);
	for (int i = 0; i < n; i++) {
		if (i)
			fputs(", ", out);
		mo_json_string(out, tp->tensors[ts[i]].name);
	}
	fputc(']', out);
}

static void json_shapes(const struct mo_tp *tp, const int *ts, int n, FILE *out)
{
	fputc('{', out);
	for (int i = 0; i < n; i++) {
		const struct mo_tensor *t = &tp->tensors[ts[i]];
		if (i)
			fputs(", ", out);
		mo_json_string(out, t->name);
		fprintf(out, ": {\"dtype\": \"%s\", \"shape\": [", mo_onnx_dtype_name(t->dtype));
		for (int d = 0; d < t->rank; d++)
			fprintf(out, "%s%" PRId64, d ? ", " : "", t->dims[d]);
		fputs("]}", out);
	}
	fputc('}', out);
}

void mo_part_print_json(const struct mo_tp *tp, const struct mo_partition *p,
			const struct mo_partition *pad, FILE *out)
{
	fputs("{\"regions\": [", out);
	const struct mo_region *r;
	for (int ri = 0; (r = nth_region(p, pad, ri)); ri++) {
		fputs(ri ? ",\n  {\"nodes\": [" : "\n  {\"nodes\": [", out);
		for (int i = 0; i < r->n_nodes; i++) {
			if (i)
				fputs(", ", out);
			mo_json_string(out, tp->node_names[r->nodes[i]]);
		}
		fputs("], \"op_types\": [", out);
		for (int i = 0; i < r->n_nodes; i++) {
			if (i)
				fputs(", ", out);
			mo_json_string(out, node_op_type(tp, r->nodes[i]));
		}
		fputs("], \"inputs\": ", out);
		json_tensors(tp, r->inputs, r->n_inputs, out);
		fputs(", \"outputs\": ", out);
		json_tensors(tp, r->outputs, r->n_outputs, out);
		fputs(", \"input_types\": ", out);
		json_shapes(tp, r->inputs, r->n_inputs, out);
		fputs(", \"output_types\": ", out);
		json_shapes(tp, r->outputs, r->n_outputs, out);
		fprintf(out, ", \"ops\": %d, \"exps\": %d, \"matmul_chain\": %d, \"flops\": %" PRIu64
			", \"bytes_fused\": %" PRIu64 ", \"bytes_unfused\": %" PRIu64 ", \"padded\": %s}",
			r->n_ops, r->exps, r->matmul_chain, r->flops, r->bytes_fused,
			r->bytes_unfused, ri < p->n_regions ? "false" : "true");
	}
	fputs("],\n\"unfused\": [", out);
	for (int i = 0, first = 1; i < tp->n_ops; i++) {
		if (in_region(p, pad, i))
			continue;
		fputs(first ? "\n  {\"node\": " : ",\n  {\"node\": ", out);
		first = 0;
		mo_json_string(out, tp->node_names[tp->ops[i].node]);
		fputs(", \"reason\": ", out);
		mo_json_string(out, tp->ops[i].note ? tp->ops[i].note
				    : tp->ops[i].n_out > 1 ? "several outputs: a μGraph op makes one"
				    : "nothing to fuse it with");
		fputc('}', out);
	}
	fputs("],\n\"symbols\": [", out);
	for (int i = 0, first = 1; i < tp->n_syms; i++) {
		const struct mo_tp_sym *s = &tp->syms[i];
		if (!s->in_input && !s->whole_text)
			continue;
		fputs(first ? "\n  {\"name\": " : ",\n  {\"name\": ", out);
		first = 0;
		mo_json_string(out, s->name);
		if (s->bound) {
			fprintf(out, ", \"value\": %" PRId64 ", \"how\": ", s->value);
			mo_json_string(out, s->how);
		} else {
			fputs(", \"value\": null", out);
		}
		if (s->past) { /* a KV cache's new tokens: their past's symbol */
			fputs(", \"kv_cache_past\": ", out);
			mo_json_string(out, s->past);
		}
		fputc('}', out);
	}
	fputs("]}\n", out);
}

static void dot_id(FILE *out, const char *prefix, int i)
{
	fprintf(out, "%s%d", prefix, i);
}

static void dot_label(FILE *out, const char *s)
{
	fputc('"', out);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', out);
		fputc(*s, out);
	}
	fputc('"', out);
}

void mo_part_print_dot(const struct mo_tp *tp, const struct mo_partition *p, FILE *out)
{
	static const char *colors[] = { "#fbb4ae", "#b3cde3", "#ccebc5", "#decbe4",
					"#fed9a6", "#ffffcc", "#e5d8bd", "#fddaec" };
	int *node_region = mo_calloc((size_t)tp->n_nodes + 1, sizeof(int));
	if (!node_region)
		return;
	for (int i = 0; i < tp->n_nodes; i++)
		node_region[i] = -1;
	for (int ri = 0; ri < p->n_regions; ri++)
		for (int i = 0; i < p->regions[ri].n_nodes; i++)
			node_region[p->regions[ri].nodes[i]] = ri;

	fputs("digraph mirage_onnx {\n  rankdir=TB;\n  node [shape=box, style=filled, "
	      "fillcolor=white, fontname=Helvetica];\n", out);
	for (int ri = -1; ri < p->n_regions; ri++) {
		if (ri >= 0)
			fprintf(out, "  subgraph cluster_%d {\n    label=\"region %d\";\n"
				"    style=filled; color=\"%s\";\n", ri + 1, ri + 1,
				colors[ri % 8]);
		for (int i = 0; i < tp->n_nodes; i++) {
			if (node_region[i] != ri)
				continue;
			char label[400];
			snprintf(label, sizeof label, "%s\\n%s", tp->node_names[i],
				 node_op_type(tp, i));
			fputs("    ", out);
			dot_id(out, "n", i);
			fputs(" [label=", out);
			fputc('"', out);
			for (const char *c = label; *c; c++) {
				if (*c == '"')
					fputc('\\', out);
				fputc(*c, out);
			}
			fputc('"', out);
			fputs("];\n", out);
		}
		if (ri >= 0)
			fputs("  }\n", out);
	}
	for (int t = 0; t < tp->n_tensors; t++) {
		const struct mo_tensor *x = &tp->tensors[t];
		if (x->kind == MO_T_INPUT || x->is_graph_output) {
			fputs("  ", out);
			dot_id(out, "t", t);
			fputs(" [shape=ellipse, label=", out);
			dot_label(out, x->name);
			fputs("];\n", out);
		}
		for (int c = 0; c < x->n_consumers; c++) {
			if (x->kind == MO_T_INPUT) {
				fputs("  ", out);
				dot_id(out, "t", t);
			} else if (x->source_node >= 0) {
				fputs("  ", out);
				dot_id(out, "n", x->source_node);
			} else {
				continue; /* weights would clutter the picture */
			}
			fputs(" -> ", out);
			dot_id(out, "n", x->consumers[c]);
			fputs(";\n", out);
		}
		if (x->is_graph_output && x->source_node >= 0) {
			fputs("  ", out);
			dot_id(out, "n", x->source_node);
			fputs(" -> ", out);
			dot_id(out, "t", t);
			fputs(";\n", out);
		}
	}
	fputs("}\n", out);
	mo_free(node_region);
}
