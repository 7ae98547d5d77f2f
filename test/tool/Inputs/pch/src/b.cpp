/* A TU of the group: comments, blank lines and a trailing comment
   do not end the leading includes. */

#include <proj/model.h>
#include <tt/tt.h> // the runtime
#include <vector>

void use(const tt::Tensor &);

void copyThenAdd_b() {
  tt::Tensor a = makeOnes();
  tt::Tensor b = a;
  b.add_(1);
  use(a);
}
