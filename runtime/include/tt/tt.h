// Umbrella header of the tensor-tidy runtime: #include <tt/tt.h>.
#pragma once

#include "tt/op_semantics.h"
#include "tt/tensor.h"
#include "tt/types.h"
