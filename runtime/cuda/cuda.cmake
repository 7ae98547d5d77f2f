# The CUDA backend, included by runtime/CMakeLists.txt when TT_HAVE_CUDA.
# Its objects go into the one shared tt_runtime; cudart and cuBLAS are private
# dependencies (nothing CUDA appears in the public headers).
set(TT_CUDA_DIR ${CMAKE_CURRENT_LIST_DIR})
add_library(tt_cuda OBJECT
  ${TT_CUDA_DIR}/plan.cpp
  ${TT_CUDA_DIR}/caching_allocator.cpp
  ${TT_CUDA_DIR}/device.cpp
  ${TT_CUDA_DIR}/blas.cpp
  ${TT_CUDA_DIR}/copy.cu
  ${TT_CUDA_DIR}/elementwise.cu
  ${TT_CUDA_DIR}/reduce.cu
)
set_target_properties(tt_cuda PROPERTIES POSITION_INDEPENDENT_CODE ON
  CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_compile_features(tt_cuda PRIVATE cxx_std_17)
target_include_directories(tt_cuda PRIVATE ${TT_CUDA_DIR} ${CMAKE_CURRENT_SOURCE_DIR}/include
  ${CMAKE_CURRENT_SOURCE_DIR}/src)
target_link_libraries(tt_cuda PRIVATE CUDA::cudart CUDA::cublas)
