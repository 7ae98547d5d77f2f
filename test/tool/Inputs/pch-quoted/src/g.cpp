// Its header defines a macro ahead of the library: parsed without a PCH.
#include "tuned.h"

void use(const tt::Tensor &);

void copyThenAdd_g() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
