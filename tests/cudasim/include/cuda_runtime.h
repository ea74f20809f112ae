/* cudasim shadow of <cuda_runtime.h>: the tests' CUDA execution layer (see ../README.md) */
#include "../cudasim.h"
