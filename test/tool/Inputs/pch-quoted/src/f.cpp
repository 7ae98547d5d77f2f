// Two project headers deep: net.h, then model.h.
#include "sub/net.h"

void use(const tt::Tensor &);

void copyThenAdd_f() {
  tt::Tensor a = makeTwos();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
