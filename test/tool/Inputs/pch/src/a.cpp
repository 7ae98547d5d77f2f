// A TU of the group: its leading includes are the shared prefix.
#include <proj/model.h>
#include <tt/tt.h>
#include <vector>

void use(const tt::Tensor &);

void copyThenAdd_a() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
