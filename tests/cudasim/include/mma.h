/* cudasim shadow of <mma.h>: the tests' CUDA execution layer (see ../README.md) */
#include "../cudasim.h"
