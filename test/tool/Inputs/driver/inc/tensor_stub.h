// Just enough of a tensor class for the checks: the driver's tests stay fast
// and independent of the runtime's headers.
#pragma once
namespace tt {
struct Tensor {
  Tensor t() const;
  Tensor view(int) const;
  Tensor reshape(int) const;
  Tensor contiguous() const;
};
} // namespace tt
