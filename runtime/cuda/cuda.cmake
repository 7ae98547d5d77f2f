# The CUDA backend, included by runtime/CMakeLists.txt. With TT_HAVE_CUDA its
# objects go into the one shared tt_runtime, with cudart and cuBLAS as private
# dependencies (no CUDA header in tt/*.h); without it, tt/cuda.h's functions
# come from a stub that throws "Torch not compiled with CUDA enabled".
set(TT_CUDA_DIR ${CMAKE_CURRENT_LIST_DIR})
if(NOT TT_HAVE_CUDA)
  target_sources(tt_runtime PRIVATE ${TT_CUDA_DIR}/cuda_stub.cpp)
  return()
endif()

add_library(tt_cuda OBJECT
  ${TT_CUDA_DIR}/plan.cpp
  ${TT_CUDA_DIR}/caching_allocator.cpp
  ${TT_CUDA_DIR}/device.cpp
  ${TT_CUDA_DIR}/blas.cpp
  ${TT_CUDA_DIR}/cuda_backend.cpp
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
if(TT_TRACE)
  target_compile_definitions(tt_cuda PRIVATE TT_WITH_TRACE=1)
endif()

target_sources(tt_runtime PRIVATE $<TARGET_OBJECTS:tt_cuda>)
target_link_libraries(tt_runtime PRIVATE CUDA::cudart CUDA::cublas)
target_compile_definitions(tt_runtime PRIVATE TT_WITH_CUDA=1)
