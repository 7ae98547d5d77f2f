// Teacher-student training with an EMA teacher made by detach(): the EMA
// update rewrites the student's weights after the forward pass saved them,
// and backward() refuses; the fix makes the teacher its own copy.
#include <tt/tt.h>

#include <cstdio>

int main() {
  tt::manual_seed(12);
  tt::Tensor student = tt::randn({6, 2}).mul(0.5).requires_grad_();
  tt::Tensor teacher = student.detach(); // meant as the teacher's own weights
  for (int step = 0; step < 3; ++step) {
    tt::Tensor x = tt::randn({4, 6});
    tt::Tensor s = x.matmul(student);
    tt::Tensor t = x.matmul(teacher);
    tt::Tensor reg = student.pow(2).sum().mul(1e-2); // pow saves student
    tt::Tensor loss = (s - t).pow(2).mean() + reg;
    teacher.mul_(0.9);
    loss.backward();
    std::printf("step %d loss %.5f\n", step, loss.item<float>());
    {
      tt::NoGradGuard g;
      student.sub_(student.grad().mul(0.1));
      student.mutable_grad().zero_();
    }
  }
  return 0;
}
