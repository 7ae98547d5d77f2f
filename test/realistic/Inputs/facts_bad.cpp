// Input of facts-selftest.test: one FACT that holds, one that does not, one annotation without a FACT.
// FACT: x = torch.randn(2, 3); assert raises(lambda: x.t().view(-1), "view size is not compatible")
x.t().view({-1}); // EXPECT: tensor-view-non-contiguous
// FACT: x = torch.randn(2, 3); assert is_copy_of(x.reshape(-1), x)
x.reshape({-1}); // LOOKALIKE: tensor-reshape-non-contiguous -- a view
















y.contiguous(); // LOOKALIKE: tensor-alias-then-mutate -- no FACT within 15 lines
