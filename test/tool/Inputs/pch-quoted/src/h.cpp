// Its header is found on the include path, not beside it: parsed without a PCH.
#include "lib.h"

void use(const tt::Tensor &);

void copyThenAdd_h() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
