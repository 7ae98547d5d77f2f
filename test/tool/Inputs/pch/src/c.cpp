// A macro ahead of the includes: the PCH would not see it, so no PCH.
#define TT_PCH_TEST_MACRO 1
#include <proj/model.h>
#include <tt/tt.h>

void use(const tt::Tensor &);

void copyThenAdd_c() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(TT_PCH_TEST_MACRO);
  use(a);
}
