// codec.cu: the NVIDIA compile unit of the format codecs (NVRTC through CuPy's RawModule, backends/codec.py).
// The kernels live in mx_codec.cuh, shared word for word with kernels_hip/codec.hip; the format comes in as
// -D defines generated from mxcore.formats (backends/codec.py format_defines).
#include "mx_codec.cuh"
