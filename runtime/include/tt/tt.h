// Umbrella header of the tensor-tidy runtime.
#pragma once

#include "tt/op_semantics.h"
#include "tt/tensor.h"
