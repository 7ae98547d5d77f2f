#include "util.h"
int clean() { return util_shadow(1); }
