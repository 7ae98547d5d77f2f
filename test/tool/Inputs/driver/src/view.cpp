#include "util.h"
tt::Tensor flat(tt::Tensor x) {
  return x.t().view(-1);
}
