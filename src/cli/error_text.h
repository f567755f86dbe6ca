// The error line as printed: one line of valid UTF-8 whatever the message quotes (a file name or record
// with invalid UTF-8, control characters or newlines is escaped, not echoed raw into the terminal).
#pragma once
#include <string>

namespace soltrain {

// Valid UTF-8 is kept; invalid bytes and control characters become \xNN, a newline becomes \n.
std::string printable_line(const std::string& s);

}  // namespace soltrain
