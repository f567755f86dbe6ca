// RFC 4180 CSV (and TSV with a tab): quoted fields may hold delimiters, quotes ("") and line breaks.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace soltrain {

struct CsvField {
  std::string value;
  bool quoted = false;
};

struct CsvRow {
  std::vector<CsvField> fields;
  size_t line = 0;     // where the row starts (1-based)
  bool blank = false;  // an empty line: no row
  std::string error;   // bad quoting; the parser resumes at the next line
};

class CsvParser {
 public:
  CsvParser(std::string_view text, char delim) : text_(text), delim_(delim) {}
  // False at the end of the text.
  bool next(CsvRow& row);

 private:
  bool at_line_end() const;  // at \n, or \r (alone or before \n)
  void skip_line();
  std::string_view text_;
  char delim_;
  size_t pos_ = 0, line_ = 1;
};

}  // namespace soltrain
