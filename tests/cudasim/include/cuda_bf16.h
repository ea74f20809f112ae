/* cudasim shadow of <cuda_bf16.h>: the tests' CUDA execution layer (see ../README.md) */
#include "../cudasim.h"
