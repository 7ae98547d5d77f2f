#include "util.h"
struct Widget {
  int size() const { return util_shadow(0); };
};
