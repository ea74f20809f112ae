/* The tensor program as JSON (--dump-tp), and JSON string escaping. */
#include "mo_tp.h"

#include <math.h>

#include <inttypes.h>

/* The length of the well-formed UTF-8 sequence at c (RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF), or 0 if there is none. */
static int utf8_sequence(const unsigned char *c)
{
	int n;
	unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte */
	if (c[0] >= 0xc2 && c[0] <= 0xdf)
		n = 2;
	else if (c[0] >= 0xe0 && c[0] <= 0xef) {
		n = 3;
		if (c[0] == 0xe0)
			lo = 0xa0;
		else if (c[0] == 0xed)
			hi = 0x9f;
	} else if (c[0] >= 0xf0 && c[0] <= 0xf4) {
		n = 4;
		if (c[0] == 0xf0)
			lo = 0x90;
		else if (c[0] == 0xf4)
			hi = 0x8f;
	} else
		return 0;
	if (c[1] < lo || c[1] > hi)
		return 0;
	for (int k = 2; k < n; k++)
		if (c[k] < 0x80 || c[k] > 0xbf)
			return 0;
	return n;
}

/* A JSON string of s. Names in a model are bytes, and JSON is UTF-8: a
 * byte that starts no well-formed sequence is written as U+FFFD, so the
 * manifest and reports stay valid JSON whatever the model holds. */
void mo_json_string(FILE *out, const char *s)
{
	fputc('"', out);
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c == '"' || *c == '\\')
			fprintf(out, "\\%c", *c);
		else if (*c < 0x20 || *c == 0x7f)
			fprintf(out, "\\u%04x", *c);
		else if (*c < 0x80)
			fputc(*c, out);
		else {
			int n = utf8_sequence(c);
			if (n) {
				fwrite(c, 1, (size_t)n, out);
				c += n - 1;
			} else
				fputs("\\ufffd", out);
		}
	}
	fputc('"', out);
}

static const char *kind_name(enum mo_tensor_kind k)
{
	switch (k) {
	case MO_T_INPUT: return "input";
	case MO_T_INITIALIZER: return "initializer";
	case MO_T_CONST: return "constant";
	case MO_T_VALUE: return "value";
	}
	return "?";
}

static void int_list(FILE *out, const int *v, int n, const struct mo_tp *tp)
{
	fputc('[', out);
	for (int i = 0, first = 1; i < n; i++) {
		if (v[i] < 0)
			continue;
		if (!first)
			fputs(", ", out);
		first = 0;
		mo_json_string(out, tp->tensors[v[i]].name);
	}
	fputc(']', out);
}

void mo_tp_print_json(const struct mo_tp *tp, FILE *out)
{
	fputs("{\"tensors\": [", out);
	for (int i = 0; i < tp->n_tensors; i++) {
		const struct mo_tensor *t = &tp->tensors[i];
		fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", out);
		mo_json_string(out, t->name);
		fprintf(out, ", \"kind\": \"%s\", \"dtype\": \"%s\", \"shape\": ",
			kind_name(t->kind), mo_onnx_dtype_name(t->dtype));
		if (!t->shape_known) {
			fputs("null", out);
		} else {
			fputc('[', out);
			for (int d = 0; d < t->rank; d++)
				fprintf(out, "%s%" PRId64, d ? ", " : "", t->dims[d]);
			fputc(']', out);
		}
		if (t->ivals) { /* a small integer constant, read or folded */
			fputs(", \"values\": [", out);
			for (size_t k = 0; k < t->n_vals; k++)
				fprintf(out, "%s%" PRId64, k ? ", " : "", t->ivals[k]);
			fputc(']', out);
		} else if (t->fvals) { /* a small float one (not finite: a string) */
			fputs(", \"values\": [", out);
			for (size_t k = 0; k < t->n_vals; k++) {
				double v = t->fvals[k];
				if (isfinite(v))
					fprintf(out, "%s%.17g", k ? ", " : "", v);
				else
					fprintf(out, "%s\"%s\"", k ? ", " : "",
						isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
			}
			fputc(']', out);
		}
		fputc('}', out);
	}
	fputs("],\n\"ops\": [", out);
	for (int i = 0; i < tp->n_ops; i++) {
		const struct mo_tp_op *op = &tp->ops[i];
		fputs(i ? ",\n  {\"node\": " : "\n  {\"node\": ", out);
		mo_json_string(out, tp->node_names[op->node]);
		fputs(", \"op\": ", out);
		mo_json_string(out, mo_onnx_proto(tp->model)->graph->node[op->node]->op_type);
		fprintf(out, ", \"class\": \"%s\", \"exps\": %d, \"inputs\": ",
			mo_lax_name(op->lax), op->exps);
		int_list(out, op->in, op->n_in, tp);
		fputs(", \"outputs\": ", out);
		int_list(out, op->out, op->n_out, tp);
		if (op->note) {
			fputs(", \"note\": ", out);
			mo_json_string(out, op->note);
		}
		fputc('}', out);
	}
	fputs("]}\n", out);
}
