// soltrain's version (pyproject.toml's, the one place it is written): `--version`, model cards.
#pragma once

namespace soltrain {
const char* soltrain_version();
}
