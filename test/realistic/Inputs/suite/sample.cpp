// Input of scorer.test: the annotations and the findings fake_tidy.py reports.
a(); // FAKE: tensor-view-non-contiguous // EXPECT: tensor-view-non-contiguous
b(); // EXPECT: tensor-reshape-non-contiguous
c(); // FAKE: tensor-inplace-on-detached // EXPECT: tensor-alias-then-mutate
d(); // FAKE: tensor-clone-in-loop // LOOKALIKE: tensor-clone-in-loop -- a no-op
e(); // FAKE: tensor-view-non-contiguous
f(); // FAKE: tensor-view-non-contiguous FAKE: tensor-view-non-contiguous // EXPECT: tensor-view-non-contiguous
g(); // FAKE: tensor-inplace-on-expanded FAKE: tensor-inplace-on-saved // EXPECT: tensor-inplace-on-expanded // LOOKALIKE: tensor-inplace-on-saved -- two annotations on one line
