/* Private to the onnx module. */
#ifndef MO_ONNX_INT_H
#define MO_ONNX_INT_H

#include <pthread.h>

#include "mo_onnx.h"

struct mo_extfile {
	char *location; /* as written in the model */
	int fd;         /* open for pread; never mapped (truncation = SIGBUS) */
	uint64_t size;  /* when it was opened */
};

/* Where the bytes of one externally stored tensor are. */
struct mo_extref {
	const Onnx__TensorProto *tensor;
	size_t file;    /* index in ext_files */
	uint64_t off;
	size_t len;
	uint8_t *buf;   /* the bytes, read on first use; NULL before */
};

struct mo_model {
	Onnx__ModelProto *proto;
	char *name;      /* path or name, for messages */
	char *dir;       /* canonical folder external data is relative to */
	size_t file_size;
	struct mo_extfile *ext_files;
	size_t n_ext_files;
	struct mo_extref *ext_refs; /* sorted by tensor pointer */
	size_t n_ext_refs;
	pthread_mutex_t ext_lock; /* guards reading ext_refs' bytes */
	bool lock_ready;
};

/* Bits per element of a TensorProto.DataType; 0 for strings and unknowns. */
unsigned mo_onnx_dtype_bits(int32_t data_type);

/* Frees a message made by the loader or with mo_malloc (what
 * mo_onnx_free frees the model's with). */
void mo_onnx_free_message(ProtobufCMessage *msg);

#endif
