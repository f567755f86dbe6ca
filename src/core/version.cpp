#include "core/version.h"

namespace soltrain {
const char* soltrain_version() {
  return SOLTRAIN_VERSION;
}  // defined by CMake for this file alone
}  // namespace soltrain
