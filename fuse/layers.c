/* What the fused model serves of each layer (mo_fuse_layers): the layer and
 * the module of an op are read off its ONNX node's scope, which exporters
 * write as the node's name ("/model/layers.3/self_attn/q_proj/MatMul":
 * Optimum, TorchScript) or as node metadata ("pkg.torch.onnx.name_scopes",
 * whose innermost scope is 'model.model.layers.3.self_attn.q_proj': torch's
 * dynamo exporter).
 * The layer is the first word followed by a number ("layers.3", "h.3",
 * "layer.3"), the module the scope's word after it ("self_attn"). Only
 * words of letters, digits and '_' count, so nothing else a model names
 * reaches the report. */
#include "mo_fuse.h"

#include <ctype.h>
#include <string.h>

#define MAX_WORD 40

static bool is_word(const char *s, size_t n)
{
	if (n == 0 || n >= MAX_WORD || isdigit((unsigned char)s[0]))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '_')
			return false;
	return true;
}

static bool is_number(const char *s, size_t n)
{
	if (n == 0 || n > 6)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isdigit((unsigned char)s[i]))
			return false;
	return true;
}

/* layer and module of a scope of len characters whose words are parted by
 * '/' and '.'; false when it names no layer. */
static bool parse_scope(const char *s, size_t len, char *layer, char *module)
{
	const char *w[64];
	size_t wl[64];
	int n = 0;
	for (size_t i = 0; i < len && n < 64;) {
		size_t j = i;
		while (j < len && s[j] != '/' && s[j] != '.')
			j++;
		if (j > i) {
			w[n] = s + i;
			wl[n++] = j - i;
		}
		i = j + 1;
	}
	for (int k = 1; k < n; k++) {
		if (!is_number(w[k], wl[k]) || !is_word(w[k - 1], wl[k - 1]))
			continue;
		snprintf(layer, MO_FUSE_NAME_LEN, "%.*s.%.*s", (int)wl[k - 1], w[k - 1], (int)wl[k],
			 w[k]);
		module[0] = 0;
		if (k + 1 < n && is_word(w[k + 1], wl[k + 1]))
			snprintf(module, MO_FUSE_NAME_LEN, "%.*s", (int)wl[k + 1], w[k + 1]);
		return true;
	}
	return false;
}

/* The metadata entry `key` of node n: the system's onnx.proto may predate
 * NodeProto.metadata_props (field 9), which then arrives as an unknown
 * field, kept as read. */
static bool node_metadata(const Onnx__NodeProto *n, const char *key, char *buf, size_t len)
{
	const ProtobufCMessage *m = &n->base;
	for (unsigned i = 0; i < m->n_unknown_fields; i++) {
		const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
		if (u->tag != 9 || u->wire_type != PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED)
			continue;
		/* data holds the field as read: its length, a varint, first */
		size_t at = 0;
		while (at < u->len && at < 10 && (u->data[at] & 0x80))
			at++;
		if (++at > u->len)
			continue;
		Onnx__StringStringEntryProto *e =
			onnx__string_string_entry_proto__unpack(NULL, u->len - at, u->data + at);
		bool hit = e && e->key && e->value && strcmp(e->key, key) == 0;
		if (hit)
			snprintf(buf, len, "%s", e->value);
		if (e)
			onnx__string_string_entry_proto__free_unpacked(e, NULL);
		if (hit)
			return true;
	}
	return false;
}

/* The layer and module of node n (layer "" when none). */
static void node_scope(const Onnx__NodeProto *n, char *layer, char *module)
{
	layer[0] = module[0] = 0;
	char scopes[8192];
	if (node_metadata(n, "pkg.torch.onnx.name_scopes", scopes, sizeof scopes)) {
		/* "['', 'model', ..., 'model.model.layers.3.self_attn', 'view']":
		 * the innermost scope, before the op's own name */
		char *q[4] = { 0 };
		for (char *c = strchr(scopes, '\''); c; c = strchr(c + 1, '\'')) {
			memmove(q, q + 1, sizeof q - sizeof *q);
			q[3] = c;
		}
		if (q[0] && parse_scope(q[0] + 1, (size_t)(q[1] - q[0] - 1), layer, module))
			return;
	}
	/* a node name: its last part is the op's own name, not a scope */
	const char *name = n->name ? n->name : "";
	const char *slash = strrchr(name, '/');
	if (slash && !parse_scope(name, (size_t)(slash - name), layer, module))
		layer[0] = module[0] = 0;
}

static bool is_float_type(int32_t dt)
{
	return dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16 ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE ||
	       dt == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
}

/* Counts an op in layer l (and its module: returns the module's index,
 * -1 for none). */
static int count_op(struct mo_fuse_layer *l, const char *module, bool fused, bool is_float,
		    double mm, bool unsized)
{
	l->ops++;
	l->matmuls_unsized += unsized;
	l->fused_ops += fused;
	l->float_ops += is_float;
	l->fused_float_ops += is_float && fused;
	l->matmul_flops += mm;
	l->fused_matmul_flops += fused ? mm : 0;
	if (!module)
		return -1;
	int k = 0;
	while (k < l->n_modules && strcmp(l->modules[k].name, module) != 0)
		k++;
	if (k == l->n_modules) {
		if (k == MO_FUSE_MAX_MODULES) { /* the rest, together */
			k = MO_FUSE_MAX_MODULES - 1;
			snprintf(l->modules[k].name, sizeof l->modules[k].name, "...");
		} else {
			snprintf(l->modules[k].name, sizeof l->modules[k].name, "%s", module);
			l->n_modules++;
		}
	}
	l->modules[k].ops++;
	l->modules[k].fused_ops += fused;
	return k;
}

bool mo_fuse_layers(const struct mo_tp *tp, const struct mo_fuse_region *rs, int nu,
		    struct mo_fuse_layers *out)
{
	memset(out, 0, sizeof *out);
	snprintf(out->all.name, sizeof out->all.name, "all");
	const Onnx__GraphProto *g = mo_onnx_proto(tp->model)->graph;
	int *unit = mo_malloc(sizeof *unit * ((size_t)tp->n_ops + 1));
	int *layer_of = mo_malloc(sizeof *layer_of * ((size_t)tp->n_ops + 1));
	int *module_of = mo_malloc(sizeof *module_of * ((size_t)tp->n_ops + 1));
	int *seen = mo_malloc(sizeof *seen * ((size_t)tp->n_ops + 2));
	char (*modules)[MO_FUSE_NAME_LEN] = mo_malloc(sizeof *modules * ((size_t)tp->n_ops + 1));
	bool ok = unit && layer_of && module_of && seen && modules;
	for (int v = 0; ok && v < tp->n_ops; v++)
		unit[v] = -1;
	for (int u = 0; ok && u < nu; u++)
		for (int k = 0; rs[u].fused && k < rs[u].rg->n_ops; k++)
			unit[rs[u].rg->ops[k]] = u;
	/* each op's layer, the layers in the order their first ops come */
	for (int v = 0; ok && v < tp->n_ops; v++) {
		char layer[MO_FUSE_NAME_LEN];
		node_scope(g->node[tp->ops[v].node], layer, modules[v]);
		int l = 0;
		while (l < out->n && strcmp(out->layer[l].name, layer) != 0)
			l++;
		if (l == out->n) {
			struct mo_fuse_layer *grown =
				mo_realloc(out->layer, sizeof *grown * ((size_t)out->n + 1));
			if (!(ok = grown != NULL))
				break;
			out->layer = grown;
			memset(&out->layer[l], 0, sizeof out->layer[l]);
			snprintf(out->layer[l].name, sizeof out->layer[l].name, "%s", layer);
			out->n++;
		}
		layer_of[v] = l;
		const struct mo_tp_op *op = &tp->ops[v];
		bool fused = unit[v] >= 0;
		bool fl = op->n_out > 0 && op->out[0] >= 0 && is_float_type(tp->tensors[op->out[0]].dtype);
		bool is_mm = op->kind == MO_OP_MATMUL || op->kind == MO_OP_GEMM;
		bool sized = is_mm && op->n_out > 0 && op->out[0] >= 0 &&
			     tp->tensors[op->out[0]].shape_known;
		for (int i = 0; sized && i < op->n_in; i++)
			sized = op->in[i] < 0 || tp->tensors[op->in[i]].shape_known;
		double mm = sized ? (double)mo_tp_op_flops(tp, op) : 0;
		if (layer[0] && !modules[v][0]) /* an op of the layer's own */
			snprintf(modules[v], MO_FUSE_NAME_LEN, "(layer)");
		module_of[v] = count_op(&out->layer[l], layer[0] ? modules[v] : NULL, fused, fl, mm,
					is_mm && !sized);
		count_op(&out->all, NULL, fused, fl, mm, is_mm && !sized);
	}
	/* each fused op in every layer it serves; per (layer, module): the
	 * last unit counted in it, + 1 */
	int *mseen = ok ? mo_calloc((size_t)out->n * MO_FUSE_MAX_MODULES + 1, sizeof *mseen)
			: NULL;
	ok = ok && mseen;
	for (int u = 0; ok && u < nu; u++) {
		if (!rs[u].fused)
			continue;
		int kernels = rs[u].r.best ? rs[u].r.best->n_ops : 0;
		out->all.custom_ops++;
		out->all.kernels += kernels;
		for (int l = 0; l < out->n; l++)
			seen[l] = 0;
		for (int k = 0; k < rs[u].rg->n_ops; k++) {
			int l = layer_of[rs[u].rg->ops[k]];
			if (!seen[l]++) {
				out->layer[l].custom_ops++;
				out->layer[l].kernels += kernels;
			}
		}
		/* and in every module it serves at the search sizes */
		if (rs[u].padded && !rs[u].serves_search)
			continue;
		for (int k = 0; k < rs[u].rg->n_ops; k++) {
			int v = rs[u].rg->ops[k], l = layer_of[v], m = module_of[v];
			if (m >= 0 && mseen[l * MO_FUSE_MAX_MODULES + m] != u + 1) {
				mseen[l * MO_FUSE_MAX_MODULES + m] = u + 1;
				out->layer[l].modules[m].kernels += kernels;
			}
		}
	}
	/* the ops in no layer last */
	for (int l = 0; ok && l + 1 < out->n; l++)
		if (!out->layer[l].name[0]) {
			struct mo_fuse_layer none = out->layer[l];
			memmove(&out->layer[l], &out->layer[l + 1],
				sizeof *out->layer * (size_t)(out->n - l - 1));
			out->layer[out->n - 1] = none;
			break;
		}
	mo_free(unit);
	mo_free(layer_of);
	mo_free(module_of);
	mo_free(mseen);
	mo_free(seen);
	mo_free(modules);
	if (!ok)
		mo_fuse_layers_free(out);
	return ok;
}

void mo_fuse_layers_free(struct mo_fuse_layers *l)
{
	mo_free(l->layer);
	l->layer = NULL;
	l->n = 0;
}
