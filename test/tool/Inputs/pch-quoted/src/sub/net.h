#pragma once
#include "../model.h"
inline tt::Tensor makeTwos() { return tt::ones({3}).mul(2); }
