// Sizes as a person reads them in a log line: "512 B", "7.29 KiB", "41.5 MiB", "8 GiB" (binary units, three
// significant digits, trailing zeros dropped), never "7.29561e-05 GiB".
#pragma once
#include <string>

namespace soltrain {

std::string format_bytes(double bytes);

}  // namespace soltrain
