/* cudasim shadow of <cuda_fp16.h>: the tests' CUDA execution layer (see ../README.md) */
#include "../cudasim.h"
