// Shadow of the toolkit's library_types.h for the CUDA simulator: the data type tags cuBLASLt
// takes, with the toolkit's values.
#pragma once

enum cudaDataType_t {
  CUDA_R_16F = 2,
  CUDA_R_32F = 0,
  CUDA_R_64F = 1,
  CUDA_R_16BF = 14,
  CUDA_R_8I = 3,
  CUDA_R_32I = 10,
};
using cudaDataType = cudaDataType_t;
