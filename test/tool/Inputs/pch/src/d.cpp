// Same includes, other flags: not in the group.
#include <proj/model.h>
#include <tt/tt.h>
#include <vector>

void use(const tt::Tensor &);

void copyThenAdd_d() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
