#pragma once
// Included by clean.cpp and semi.cpp: its warning is one finding for both.
inline int util_shadow(int a) {
  {
    int a = 1;
    return a;
  }
}
