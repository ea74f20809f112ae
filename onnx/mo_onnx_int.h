/* Private to the onnx module. */
#ifndef MO_ONNX_INT_H
#define MO_ONNX_INT_H

#include "mo_onnx.h"

struct mo_extfile {
	char *location; /* as written in the model */
	void *map;      /* read-only mapping of the whole file; NULL if empty */
	size_t size;
};

/* Where the bytes of one externally stored tensor are. */
struct mo_extref {
	const Onnx__TensorProto *tensor;
	const uint8_t *data;
	size_t len;
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
};

/* Bits per element of a TensorProto.DataType; 0 for strings and unknowns. */
unsigned mo_onnx_dtype_bits(int32_t data_type);

#endif
