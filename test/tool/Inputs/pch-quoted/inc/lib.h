#pragma once
#include <tt/tt.h>
inline tt::Tensor makeOnes() { return tt::ones({3}); }
