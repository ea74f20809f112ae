/* ONNX tensor element types, as numbered by TensorProto.DataType. */
#include "mo_onnx_int.h"

static const struct {
	const char *name;
	unsigned bits;
} dtypes[] = {
	[0] = { "undefined", 0 },   [1] = { "float32", 32 },
	[2] = { "uint8", 8 },       [3] = { "int8", 8 },
	[4] = { "uint16", 16 },     [5] = { "int16", 16 },
	[6] = { "int32", 32 },      [7] = { "int64", 64 },
	[8] = { "string", 0 },      [9] = { "bool", 8 },
	[10] = { "float16", 16 },   [11] = { "float64", 64 },
	[12] = { "uint32", 32 },    [13] = { "uint64", 64 },
	[14] = { "complex64", 64 }, [15] = { "complex128", 128 },
	[16] = { "bfloat16", 16 },  [17] = { "float8e4m3fn", 8 },
	[18] = { "float8e4m3fnuz", 8 }, [19] = { "float8e5m2", 8 },
	[20] = { "float8e5m2fnuz", 8 }, [21] = { "uint4", 4 },
	[22] = { "int4", 4 },       [23] = { "float4e2m1", 4 },
	[24] = { "float8e8m0", 8 }, [25] = { "uint2", 2 },
	[26] = { "int2", 2 },
};

#define N_DTYPES ((int32_t)(sizeof dtypes / sizeof dtypes[0]))

unsigned mo_onnx_dtype_bits(int32_t t)
{
	return t > 0 && t < N_DTYPES ? dtypes[t].bits : 0;
}

size_t mo_onnx_dtype_size(int32_t t)
{
	unsigned b = mo_onnx_dtype_bits(t);
	return b == 0 ? 0 : b < 8 ? 1 : b / 8;
}

const char *mo_onnx_dtype_name(int32_t t)
{
	return t >= 0 && t < N_DTYPES ? dtypes[t].name : "unknown";
}
