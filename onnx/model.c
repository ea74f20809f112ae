/* Loading and saving ONNX models. */
#include "mo_onnx_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- protobuf-c allocation through the tool's hook ---- */

static void *pb_alloc(void *data, size_t size)
{
	void *p = mo_malloc(size);
	if (!p)
		*(bool *)data = true;
	return p;
}

static void pb_free(void *data, void *p)
{
	(void)data;
	mo_free(p);
}

/* ---- the wire pre-scan ----
 *
 * protobuf-c decodes nested messages recursively with no depth limit, so a
 * hostile file of a few megabytes could overflow the stack. Before decoding,
 * this walks the wire format with the ONNX schema, bounded in depth, and tells
 * corrupt bytes apart from a well-formed protobuf that is not an ONNX model. */

enum scan_result { SCAN_OK, SCAN_CORRUPT, SCAN_NOT_MODEL, SCAN_TOO_DEEP, SCAN_NUL };

/* Deeper than any real model (a subgraph adds four levels). */
#define MAX_NESTING 100

struct scan {
	const uint8_t *start;
	size_t bad_offset;
	const char *bad_field;
};

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	uint64_t r = 0;
	for (int shift = 0; shift < 70; shift += 7) {
		if (*p >= end)
			return false;
		uint8_t b = *(*p)++;
		r |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = r;
			return true;
		}
	}
	return false;
}

static bool wire_type_fits(const ProtobufCFieldDescriptor *f, unsigned wire)
{
	bool is_len = f->type == PROTOBUF_C_TYPE_STRING ||
		      f->type == PROTOBUF_C_TYPE_BYTES ||
		      f->type == PROTOBUF_C_TYPE_MESSAGE;
	if (wire == 2) /* length-delimited, or a packed repeated scalar */
		return is_len || f->label == PROTOBUF_C_LABEL_REPEATED;
	switch (f->type) {
	case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32:
	case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_INT64:
	case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_UINT64:
	case PROTOBUF_C_TYPE_BOOL: case PROTOBUF_C_TYPE_ENUM:
		return wire == 0;
	case PROTOBUF_C_TYPE_SFIXED32: case PROTOBUF_C_TYPE_FIXED32:
	case PROTOBUF_C_TYPE_FLOAT:
		return wire == 5;
	case PROTOBUF_C_TYPE_SFIXED64: case PROTOBUF_C_TYPE_FIXED64:
	case PROTOBUF_C_TYPE_DOUBLE:
		return wire == 1;
	case PROTOBUF_C_TYPE_STRING: case PROTOBUF_C_TYPE_BYTES:
	case PROTOBUF_C_TYPE_MESSAGE:
		return false;
	}
	return false;
}

static enum scan_result scan_message(struct scan *s,
				     const ProtobufCMessageDescriptor *desc,
				     const uint8_t *p, const uint8_t *end,
				     int depth)
{
	if (depth > MAX_NESTING)
		return SCAN_TOO_DEEP;
	while (p < end) {
		const uint8_t *field_start = p;
		uint64_t tag, v;
		if (!read_varint(&p, end, &tag) || (tag >> 3) == 0 ||
		    (tag >> 3) > 0x1fffffff) {
			s->bad_offset = (size_t)(field_start - s->start);
			return SCAN_CORRUPT;
		}
		unsigned wire = (unsigned)(tag & 7);
		const ProtobufCFieldDescriptor *f =
			protobuf_c_message_descriptor_get_field(desc, (unsigned)(tag >> 3));
		if (f && !wire_type_fits(f, wire)) {
			s->bad_offset = (size_t)(field_start - s->start);
			s->bad_field = f->name;
			return SCAN_NOT_MODEL;
		}
		switch (wire) {
		case 0:
			if (!read_varint(&p, end, &v))
				goto corrupt;
			break;
		case 1:
			if (end - p < 8)
				goto corrupt;
			p += 8;
			break;
		case 5:
			if (end - p < 4)
				goto corrupt;
			p += 4;
			break;
		case 2:
			if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p))
				goto corrupt;
			/* protobuf-c hands strings on as C strings: "MatMul\0x"
			 * would be read as MatMul. doc_string is never read. */
			if (f && f->type == PROTOBUF_C_TYPE_STRING &&
			    strcmp(f->name, "doc_string") != 0 && memchr(p, 0, (size_t)v)) {
				s->bad_offset = (size_t)(field_start - s->start);
				s->bad_field = f->name;
				return SCAN_NUL;
			}
			if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
				enum scan_result r = scan_message(
					s, f->descriptor, p, p + v, depth + 1);
				if (r != SCAN_OK)
					return r;
			}
			p += v;
			break;
		default: /* groups (3, 4) are not used by ONNX; 6, 7 do not exist */
			goto corrupt;
		}
		continue;
corrupt:
		s->bad_offset = (size_t)(field_start - s->start);
		return SCAN_CORRUPT;
	}
	return SCAN_OK;
}

/* ---- reading files ---- */

/* Opens path for reading without blocking (a FIFO or a device would block
 * open() or read() until a writer comes) and accepts only regular files. */
static int open_regular(const char *path, struct stat *st, const char **why)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	*why = NULL;
	if (fd < 0)
		return -1;
	if (fstat(fd, st) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	if (!S_ISREG(st->st_mode)) {
		close(fd);
		*why = S_ISDIR(st->st_mode) ? "is a folder, not a model file"
					    : "not a regular file";
		return -1;
	}
	return fd;
}

/* Reads len bytes at off; false with errno set, or errno 0 when the file
 * ended first (it shrank since it was measured). */
static bool read_exact(int fd, uint8_t *buf, size_t len, uint64_t off)
{
	while (len) {
		ssize_t r = pread(fd, buf, len > ((size_t)1 << 30) ? (size_t)1 << 30 : len,
				  (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = 0;
			return false;
		}
		buf += r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return true;
}

/* ---- external data ---- */

static int extref_cmp(const void *a, const void *b)
{
	const struct mo_extref *x = a, *y = b;
	uintptr_t px = (uintptr_t)x->tensor, py = (uintptr_t)y->tensor;
	return px < py ? -1 : px > py;
}

/* Parses a non-negative decimal integer with nothing around it. */
static bool parse_u64(const char *s, uint64_t *out)
{
	if (!s || !*s)
		return false;
	uint64_t v = 0;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return false;
		if (v > (UINT64_MAX - 9) / 10)
			return false;
		v = v * 10 + (uint64_t)(*s - '0');
	}
	*out = v;
	return true;
}

/* True when `rel` is relative and no component is "..": resolving it against
 * the model's folder cannot climb out lexically (symlinks are checked after
 * resolution). */
static bool location_is_contained(const char *rel)
{
	if (!*rel || rel[0] == '/')
		return false;
	const char *c = rel;
	while (*c) {
		const char *slash = strchr(c, '/');
		size_t n = slash ? (size_t)(slash - c) : strlen(c);
		if (n == 2 && c[0] == '.' && c[1] == '.')
			return false;
		c += n;
		while (*c == '/')
			c++;
	}
	return true;
}

static enum mo_status map_external_file(struct mo_model *m, const char *loc,
					const char *tname, struct mo_extfile **out,
					struct mo_diag *d)
{
	for (size_t i = 0; i < m->n_ext_files; i++) {
		if (strcmp(m->ext_files[i].location, loc) == 0) {
			*out = &m->ext_files[i];
			return MO_OK;
		}
	}
	if (!location_is_contained(loc))
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: external data '%s' of tensor '%s' is outside the model's folder",
				   m->name, loc, tname);

	size_t n = strlen(m->dir) + 1 + strlen(loc) + 1;
	char *joined = mo_malloc(n);
	if (!joined)
		return mo_diag_nomem(d);
	snprintf(joined, n, "%s/%s", m->dir, loc);
	char *real = realpath(joined, NULL);
	if (!real) {
		int e = errno;
		mo_free(joined);
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: cannot open external data '%s' of tensor '%s': %s",
				   m->name, loc, tname, strerror(e));
	}
	mo_free(joined);
	size_t dl = strlen(m->dir);
	bool inside = strncmp(real, m->dir, dl) == 0 &&
		      (real[dl] == '/' || (dl == 1 && m->dir[0] == '/'));
	if (!inside) {
		free(real);
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: external data '%s' of tensor '%s' resolves outside the model's folder",
				   m->name, loc, tname);
	}
	/* Kept open and read with pread when a tensor's bytes are wanted: a
	 * mapping of a file truncated meanwhile raises SIGBUS. */
	struct stat st;
	const char *why;
	int fd = open_regular(real, &st, &why);
	free(real);
	if (fd < 0)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: cannot read external data '%s' of tensor '%s': %s",
				   m->name, loc, tname, why ? why : strerror(errno));

	struct mo_extfile *files = mo_realloc(m->ext_files,
					      (m->n_ext_files + 1) * sizeof *files);
	char *loc_copy = mo_strdup(loc);
	if (!files || !loc_copy) {
		if (files)
			m->ext_files = files;
		mo_free(loc_copy);
		close(fd);
		return mo_diag_nomem(d);
	}
	m->ext_files = files;
	struct mo_extfile *f = &files[m->n_ext_files++];
	f->location = loc_copy;
	f->fd = fd;
	f->size = (uint64_t)st.st_size;
	*out = f;
	return MO_OK;
}

/* Byte size of a tensor from its shape, or UINT64_MAX when the shape is
 * absurd (negative dims, overflow) or the type has no fixed size. */
static uint64_t shape_nbytes(const Onnx__TensorProto *t)
{
	unsigned bits = mo_onnx_dtype_bits(t->data_type);
	if (!bits)
		return UINT64_MAX;
	uint64_t n = 1;
	for (size_t i = 0; i < t->n_dims; i++) {
		if (t->dims[i] < 0)
			return UINT64_MAX;
		if (t->dims[i] != 0 && n > UINT64_MAX / (uint64_t)t->dims[i])
			return UINT64_MAX;
		n *= (uint64_t)t->dims[i];
	}
	if (n > UINT64_MAX / bits)
		return UINT64_MAX;
	return (n * bits + 7) / 8; /* sub-byte types are packed */
}

static enum mo_status bind_external(struct mo_model *m,
				    const Onnx__TensorProto *t,
				    struct mo_diag *d)
{
	const char *tname = t->name ? t->name : "";
	if (!m->dir)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: tensor '%s' has external data, which needs the model's folder",
				   m->name, tname);
	const char *loc = NULL, *off_s = NULL, *len_s = NULL;
	for (size_t i = 0; i < t->n_external_data; i++) {
		const Onnx__StringStringEntryProto *e = t->external_data[i];
		if (!e->key || !e->value)
			continue;
		if (strcmp(e->key, "location") == 0)
			loc = e->value;
		else if (strcmp(e->key, "offset") == 0)
			off_s = e->value;
		else if (strcmp(e->key, "length") == 0)
			len_s = e->value;
	}
	if (!loc)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: tensor '%s' has external data without a location",
				   m->name, tname);
	uint64_t off = 0, len = 0;
	if (off_s && !parse_u64(off_s, &off))
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: tensor '%s' has an invalid external data offset '%s'",
				   m->name, tname, off_s);
	if (len_s && !parse_u64(len_s, &len))
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: tensor '%s' has an invalid external data length '%s'",
				   m->name, tname, len_s);
	struct mo_extfile *f = NULL;
	enum mo_status st = map_external_file(m, loc, tname, &f, d);
	if (st)
		return st;
	if (off > f->size)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: external data of tensor '%s' starts at byte %llu, past the end of '%s' (%llu bytes)",
				   m->name, tname, (unsigned long long)off, loc,
				   (unsigned long long)f->size);
	if (!len_s)
		len = f->size - off;
	if (len > f->size - off)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: external data of tensor '%s' (bytes %llu..%llu) runs past the end of '%s' (%llu bytes)",
				   m->name, tname, (unsigned long long)off,
				   (unsigned long long)(off + len), loc,
				   (unsigned long long)f->size);
	uint64_t want = shape_nbytes(t);
	if (want != UINT64_MAX && want != len)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: external data of tensor '%s' has %llu bytes, its shape needs %llu",
				   m->name, tname, (unsigned long long)len,
				   (unsigned long long)want);

	struct mo_extref *refs = mo_realloc(m->ext_refs,
					    (m->n_ext_refs + 1) * sizeof *refs);
	if (!refs)
		return mo_diag_nomem(d);
	m->ext_refs = refs;
	refs[m->n_ext_refs++] = (struct mo_extref){
		.tensor = t, .file = (size_t)(f - m->ext_files), .off = off,
		.len = (size_t)len,
	};
	return MO_OK;
}

/* Values stored in the tensor itself: as many as its shape says, in the
 * field its type uses. A float32 weight relabelled bfloat16 (twice the bytes
 * its shape needs) was read as something else. */
static enum mo_status check_inline_size(const struct mo_model *m, const Onnx__TensorProto *t,
					struct mo_diag *d)
{
	const char *tname = t->name ? t->name : "";
	uint64_t want = shape_nbytes(t);
	if (t->has_raw_data) {
		if (want != UINT64_MAX && want != t->raw_data.len)
			return mo_diag_set(d, MO_ERR_INPUT,
					   "%s: tensor '%s' has %zu bytes of data, its type and shape need %llu",
					   m->name, tname, t->raw_data.len, (unsigned long long)want);
		return MO_OK;
	}
	unsigned bits = mo_onnx_dtype_bits(t->data_type);
	if (want == UINT64_MAX || bits < 8)
		return MO_OK; /* strings, packed sub-byte types: not checked here */
	uint64_t n = want / (bits / 8);
	size_t have;
	switch (t->data_type) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: have = t->n_float_data; break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX64: have = t->n_float_data / 2; break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: have = t->n_double_data; break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__COMPLEX128: have = t->n_double_data / 2; break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: have = t->n_int64_data; break;
	case ONNX__TENSOR_PROTO__DATA_TYPE__UINT32:
	case ONNX__TENSOR_PROTO__DATA_TYPE__UINT64: have = t->n_uint64_data; break;
	default: have = t->n_int32_data; break;
	}
	if (have != n)
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: tensor '%s' has %zu values, its shape needs %llu",
				   m->name, tname, have, (unsigned long long)n);
	return MO_OK;
}

static enum mo_status bind_tensor(struct mo_model *m, const Onnx__TensorProto *t,
				  struct mo_diag *d)
{
	if (t && t->has_data_location &&
	    t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
		return bind_external(m, t, d);
	return t ? check_inline_size(m, t, d) : MO_OK;
}

static enum mo_status bind_graph(struct mo_model *m, const Onnx__GraphProto *g,
				 struct mo_diag *d);

static enum mo_status bind_sparse(struct mo_model *m,
				  const Onnx__SparseTensorProto *s,
				  struct mo_diag *d)
{
	if (!s)
		return MO_OK;
	enum mo_status st = bind_tensor(m, s->values, d);
	return st ? st : bind_tensor(m, s->indices, d);
}

static enum mo_status bind_nodes(struct mo_model *m, size_t n,
				 Onnx__NodeProto *const *nodes,
				 struct mo_diag *d)
{
	for (size_t i = 0; i < n; i++) {
		for (size_t a = 0; a < nodes[i]->n_attribute; a++) {
			const Onnx__AttributeProto *at = nodes[i]->attribute[a];
			enum mo_status st = bind_tensor(m, at->t, d);
			if (!st)
				st = bind_graph(m, at->g, d);
			if (!st)
				st = bind_sparse(m, at->sparse_tensor, d);
			for (size_t k = 0; !st && k < at->n_tensors; k++)
				st = bind_tensor(m, at->tensors[k], d);
			for (size_t k = 0; !st && k < at->n_graphs; k++)
				st = bind_graph(m, at->graphs[k], d);
			for (size_t k = 0; !st && k < at->n_sparse_tensors; k++)
				st = bind_sparse(m, at->sparse_tensors[k], d);
			if (st)
				return st;
		}
	}
	return MO_OK;
}

static enum mo_status bind_graph(struct mo_model *m, const Onnx__GraphProto *g,
				 struct mo_diag *d)
{
	if (!g)
		return MO_OK;
	enum mo_status st = MO_OK;
	for (size_t i = 0; !st && i < g->n_initializer; i++)
		st = bind_tensor(m, g->initializer[i], d);
	for (size_t i = 0; !st && i < g->n_sparse_initializer; i++)
		st = bind_sparse(m, g->sparse_initializer[i], d);
	return st ? st : bind_nodes(m, g->n_node, g->node, d);
}

static enum mo_status bind_model(struct mo_model *m, struct mo_diag *d)
{
	const Onnx__ModelProto *p = m->proto;
	enum mo_status st = bind_graph(m, p->graph, d);
	for (size_t i = 0; !st && i < p->n_training_info; i++) {
		st = bind_graph(m, p->training_info[i]->initialization, d);
		if (!st)
			st = bind_graph(m, p->training_info[i]->algorithm, d);
	}
	for (size_t i = 0; !st && i < p->n_functions; i++)
		st = bind_nodes(m, p->functions[i]->n_node, p->functions[i]->node, d);
	if (!st && m->n_ext_refs > 1)
		qsort(m->ext_refs, m->n_ext_refs, sizeof *m->ext_refs, extref_cmp);
	return st;
}

/* ---- load ---- */

enum mo_status mo_onnx_load_buffer(const uint8_t *buf, size_t len,
				   const char *dir, const char *name,
				   struct mo_model **out, struct mo_diag *d)
{
	*out = NULL;
	if (len == 0)
		return mo_diag_set(d, MO_ERR_INPUT, "%s: file is empty", name);

	struct scan s = { .start = buf };
	switch (scan_message(&s, &onnx__model_proto__descriptor, buf, buf + len, 0)) {
	case SCAN_OK:
		break;
	case SCAN_CORRUPT:
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: not a valid protobuf: corrupt or truncated at byte %zu of %zu",
				   name, s.bad_offset, len);
	case SCAN_NOT_MODEL:
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: not an ONNX model: field '%s' at byte %zu has the wrong wire type",
				   name, s.bad_field, s.bad_offset);
	case SCAN_TOO_DEEP:
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: messages nested more than %d deep; refusing to decode",
				   name, MAX_NESTING);
	case SCAN_NUL:
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: invalid model: string field '%s' at byte %zu contains a NUL byte",
				   name, s.bad_field, s.bad_offset);
	}

	struct mo_model *m = mo_calloc(1, sizeof *m);
	if (!m)
		return mo_diag_nomem(d);
	m->file_size = len;
	m->lock_ready = pthread_mutex_init(&m->ext_lock, NULL) == 0;
	m->name = mo_strdup(name);
	m->dir = dir ? mo_strdup(dir) : NULL;
	if (!m->name || (dir && !m->dir)) {
		mo_onnx_free(m);
		return mo_diag_nomem(d);
	}
	bool oom = false;
	ProtobufCAllocator alloc = { pb_alloc, pb_free, &oom };
	m->proto = (Onnx__ModelProto *)protobuf_c_message_unpack(
		&onnx__model_proto__descriptor, &alloc, len, buf);
	if (!m->proto) {
		mo_onnx_free(m);
		if (oom)
			return mo_diag_nomem(d);
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: not an ONNX model: protobuf decoding failed", name);
	}
	if (!m->proto->has_ir_version || m->proto->ir_version <= 0 || !m->proto->graph) {
		const char *what = !m->proto->graph ? "graph" : "ir_version";
		mo_onnx_free(m);
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: not an ONNX model: it has no %s", name, what);
	}
	enum mo_status st = bind_model(m, d);
	if (st) {
		mo_onnx_free(m);
		return st;
	}
	*out = m;
	return MO_OK;
}

enum mo_status mo_onnx_load(const char *path, struct mo_model **out,
			    struct mo_diag *d)
{
	*out = NULL;
	struct stat st;
	const char *why;
	int fd = open_regular(path, &st, &why);
	if (fd < 0)
		return mo_diag_set(d, MO_ERR_INPUT, "%s: %s", path, why ? why : strerror(errno));
	if (st.st_size == 0) {
		close(fd);
		return mo_diag_set(d, MO_ERR_INPUT, "%s: file is empty", path);
	}
	/* protobuf limits a message to 2 GiB; larger weights live in external data. */
	if ((uint64_t)st.st_size > ((uint64_t)2 << 30)) {
		close(fd);
		return mo_diag_set(d, MO_ERR_INPUT,
				   "%s: %lld bytes is larger than protobuf's 2 GiB limit (store weights as external data)",
				   path, (long long)st.st_size);
	}
	/* Read, not mapped: a file truncated while it is decoded would raise
	 * SIGBUS in a mapping; here it is a short read. */
	size_t len = (size_t)st.st_size;
	uint8_t *buf = mo_malloc(len);
	if (!buf) {
		close(fd);
		return mo_diag_nomem(d);
	}
	if (!read_exact(fd, buf, len, 0)) {
		int e = errno;
		close(fd);
		mo_free(buf);
		return mo_diag_set(d, MO_ERR_INPUT, "%s: %s", path,
				   e ? strerror(e) : "the file shrank while it was read");
	}
	close(fd);

	/* External data is relative to the folder the model is in. */
	char *real = realpath(path, NULL);
	char *dir = NULL;
	if (real) {
		char *slash = strrchr(real, '/');
		if (slash == real)
			slash[1] = '\0';
		else if (slash)
			*slash = '\0';
		dir = real;
	}
	enum mo_status s = dir ? mo_onnx_load_buffer(buf, len, dir, path, out, d)
			       : mo_diag_set(d, MO_ERR_INPUT, "%s: %s", path, strerror(errno));
	free(real);
	mo_free(buf);
	return s;
}

void mo_onnx_free(struct mo_model *m)
{
	if (!m)
		return;
	if (m->proto) {
		ProtobufCAllocator alloc = { pb_alloc, pb_free, &(bool){false} };
		protobuf_c_message_free_unpacked(&m->proto->base, &alloc);
	}
	for (size_t i = 0; i < m->n_ext_files; i++) {
		close(m->ext_files[i].fd);
		mo_free(m->ext_files[i].location);
	}
	for (size_t i = 0; i < m->n_ext_refs; i++)
		mo_free(m->ext_refs[i].buf);
	if (m->lock_ready)
		pthread_mutex_destroy(&m->ext_lock);
	mo_free(m->ext_files);
	mo_free(m->ext_refs);
	mo_free(m->name);
	mo_free(m->dir);
	mo_free(m);
}

void mo_onnx_free_message(ProtobufCMessage *msg)
{
	ProtobufCAllocator alloc = { pb_alloc, pb_free, &(bool){false} };
	protobuf_c_message_free_unpacked(msg, &alloc);
}

Onnx__ModelProto *mo_onnx_proto(const struct mo_model *m) { return m->proto; }

int64_t mo_onnx_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
	for (size_t i = 0; i < n->n_attribute; i++) {
		const Onnx__AttributeProto *a = n->attribute[i];
		if (a->name && strcmp(a->name, name) == 0)
			return a->has_i ? a->i : dflt;
	}
	return dflt;
}

bool mo_onnx_node_is(const Onnx__NodeProto *n, const char *op)
{
	return n->op_type && !strcmp(n->op_type, op) &&
	       (!n->domain || !*n->domain || !strcmp(n->domain, "ai.onnx"));
}

const char *mo_onnx_name(const struct mo_model *m) { return m->name; }
const char *mo_onnx_dir(const struct mo_model *m) { return m->dir; }
size_t mo_onnx_file_size(const struct mo_model *m) { return m->file_size; }
size_t mo_onnx_external_file_count(const struct mo_model *m) { return m->n_ext_files; }

const char *mo_onnx_external_file(const struct mo_model *m, size_t i)
{
	return i < m->n_ext_files ? m->ext_files[i].location : NULL;
}

static struct mo_extref *find_extref(const struct mo_model *m,
					   const Onnx__TensorProto *t)
{
	if (m->n_ext_refs == 0)
		return NULL;
	struct mo_extref key = { .tensor = t };
	return bsearch(&key, m->ext_refs, m->n_ext_refs, sizeof key, extref_cmp);
}

enum mo_status mo_onnx_tensor_bytes(const struct mo_model *m,
				    const Onnx__TensorProto *t,
				    const uint8_t **data, size_t *len,
				    struct mo_diag *d)
{
	struct mo_extref *r = find_extref(m, t);
	if (r) {
		static const uint8_t empty[1];
		if (r->len == 0) {
			*data = empty;
			*len = 0;
			return MO_OK;
		}
		/* Read on first use (search threads may ask at once). */
		pthread_mutex_lock(&((struct mo_model *)m)->ext_lock);
		enum mo_status st = MO_OK;
		if (!r->buf) {
			const struct mo_extfile *f = &m->ext_files[r->file];
			uint8_t *buf = mo_malloc(r->len);
			if (!buf) {
				st = mo_diag_nomem(d);
			} else if (!read_exact(f->fd, buf, r->len, r->off)) {
				int e = errno;
				mo_free(buf);
				st = mo_diag_set(d, MO_ERR_INPUT,
						 e ? "%s: cannot read external data '%s' of tensor '%s': %s"
						   : "%s: external data '%s' of tensor '%s' was truncated after the model was loaded%s",
						 m->name, f->location, t->name ? t->name : "",
						 e ? strerror(e) : "");
			} else {
				r->buf = buf;
			}
		}
		pthread_mutex_unlock(&((struct mo_model *)m)->ext_lock);
		if (st)
			return st;
		*data = r->buf;
		*len = r->len;
		return MO_OK;
	}
	if (t->has_raw_data) {
		*data = t->raw_data.data;
		*len = t->raw_data.len;
		return MO_OK;
	}
	return mo_diag_set(d, MO_ERR_INPUT,
			   "tensor '%s' stores its values in typed fields, not as bytes",
			   t->name ? t->name : "");
}

uint64_t mo_onnx_tensor_nbytes(const struct mo_model *m,
			       const Onnx__TensorProto *t)
{
	const struct mo_extref *r = find_extref(m, t);
	if (r)
		return r->len;
	if (t->has_raw_data)
		return t->raw_data.len;
	uint64_t n = shape_nbytes(t);
	if (n != UINT64_MAX)
		return n;
	uint64_t s = 0; /* strings: the bytes of the strings themselves */
	for (size_t i = 0; i < t->n_string_data; i++)
		s += t->string_data[i].len;
	return s;
}

/* ---- values ---- */

bool mo_onnx_tensor_doubles(const struct mo_model *m, const Onnx__TensorProto *p, uint64_t n,
			    uint64_t start, uint64_t cnt, double *out)
{
	if (start > n || cnt > n - start)
		return false;
	const uint8_t *raw = NULL;
	size_t len = 0;
	struct mo_diag scratch;
	mo_diag_init(&scratch);
	bool has_bytes = mo_onnx_tensor_bytes(m, p, &raw, &len, &scratch) == MO_OK;
	switch (p->data_type) {
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
		if (has_bytes && len == n * 4) {
			for (uint64_t i = 0; i < cnt; i++) {
				float v;
				memcpy(&v, raw + 4 * (start + i), 4);
				out[i] = v;
			}
			return true;
		}
		if (p->n_float_data != n)
			return false;
		for (uint64_t i = 0; i < cnt; i++)
			out[i] = p->float_data[start + i];
		return true;
	case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
		if (has_bytes && len == n * 8) {
			memcpy(out, raw + 8 * start, cnt * 8);
			return true;
		}
		if (p->n_double_data != n)
			return false;
		memcpy(out, p->double_data + start, cnt * 8);
		return true;
	case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16:
	case ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16: {
		bool bf = p->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16;
		if (!(has_bytes && len == n * 2) && p->n_int32_data != n)
			return false;
		for (uint64_t i = 0; i < cnt; i++) {
			uint16_t h;
			if (has_bytes && len == n * 2)
				memcpy(&h, raw + 2 * (start + i), 2);
			else
				h = (uint16_t)p->int32_data[start + i];
			if (bf) {
				uint32_t bits = (uint32_t)h << 16;
				float v;
				memcpy(&v, &bits, 4);
				out[i] = v;
			} else {
				int ex = (h >> 10) & 0x1f, m = h & 0x3ff;
				double v = ex == 0 ? ldexp(m, -24) : ex == 31 ? (m ? NAN : INFINITY)
							   : ldexp(m | 0x400, ex - 25);
				out[i] = (h & 0x8000) ? -v : v;
			}
		}
		return true;
	}
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
	case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
	case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
	case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: {
		size_t w = p->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 ? 8
			 : p->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ? 4 : 1;
		if (has_bytes && len == n * w) {
			for (uint64_t i = 0; i < cnt; i++) {
				uint64_t k = start + i;
				int64_t v = 0;
				if (w == 8)
					memcpy(&v, raw + 8 * k, 8);
				else if (w == 4) {
					int32_t x;
					memcpy(&x, raw + 4 * k, 4);
					v = x;
				} else {
					v = p->data_type == ONNX__TENSOR_PROTO__DATA_TYPE__INT8
						    ? (int8_t)raw[k] : raw[k];
				}
				out[i] = (double)v;
			}
			return true;
		}
		if (w == 8 && p->n_int64_data == n) {
			for (uint64_t i = 0; i < cnt; i++)
				out[i] = (double)p->int64_data[start + i];
			return true;
		}
		if (w != 8 && p->n_int32_data == n) {
			for (uint64_t i = 0; i < cnt; i++)
				out[i] = p->int32_data[start + i];
			return true;
		}
		return false;
	}
	default:
		return false;
	}
}

/* ---- save ---- */

struct file_sink {
	ProtobufCBuffer base;
	FILE *f;
	bool failed;
};

static void sink_append(ProtobufCBuffer *b, size_t len, const uint8_t *data)
{
	struct file_sink *s = (struct file_sink *)b;
	if (len == 0) /* an empty bytes field: data may be NULL */
		return;
	if (!s->failed && fwrite(data, 1, len, s->f) != len)
		s->failed = true;
}

enum mo_status mo_onnx_check_writable(const char *path, struct mo_diag *d)
{
	char *tmp;
	int fd = mo_file_create_temp(path, &tmp, d);
	if (fd < 0)
		return d->status;
	mo_file_discard_temp(fd, tmp);
	return MO_OK;
}

enum mo_status mo_onnx_save(const struct mo_model *m, const char *path,
			    struct mo_diag *d)
{
	struct mo_file mf;
	if (mo_file_open(&mf, path, d))
		return d->status;
	struct file_sink sink = { .base = { sink_append }, .f = mf.f };
	protobuf_c_message_pack_to_buffer(&m->proto->base, &sink.base);
	if (sink.failed) {
		int e = errno;
		mo_file_discard(&mf);
		return mo_diag_set(d, MO_ERR_INPUT, "%s: cannot write: %s", path, strerror(e));
	}
	return mo_file_commit(&mf, d);
}

int64_t mo_onnx_default_opset(const Onnx__ModelProto *p)
{
	for (size_t i = 0; i < p->n_opset_import; i++) {
		const char *dom = p->opset_import[i]->domain;
		if (!dom || !*dom || strcmp(dom, "ai.onnx") == 0)
			return p->opset_import[i]->version;
	}
	return 1;
}
