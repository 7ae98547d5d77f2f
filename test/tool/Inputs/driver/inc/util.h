#pragma once
#include "tensor_stub.h"
inline int util_shadow(int a) {
  {
    int a = 1;
    return a;
  }
}
