/* cudasim shadow of <cuda_pipeline.h>: the tests' CUDA execution layer (see ../README.md) */
#include "../cudasim.h"
