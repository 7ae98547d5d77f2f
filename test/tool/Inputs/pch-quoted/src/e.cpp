// Starts with a project header whose guard leads to <tt/tt.h>: the group.
#include "model.h"

void use(const tt::Tensor &);

void copyThenAdd_e() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
