// codec.hip: the AMD compile unit of the format codecs (hiprtc at run time, clang-22 in CI).  The kernels are
// kernels_cuda/mx_codec.cuh, the same text NVRTC compiles (mxcore.kernels.kernel_source inlines it); the format
// comes in as -D defines generated from mxcore.formats (backends/codec.py format_defines).
#include "../kernels_cuda/mx_codec.cuh"
