// A compiler crash in one TU must not take the others down.
#pragma clang __debug crash
