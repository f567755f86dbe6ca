// A quote is special only at the start of a field (a quote inside an unquoted field is kept, as Python's
// csv module and pandas do); after a closing quote only a delimiter or a line break may follow, and a quote
// left open at the end of the file is an error: both mean the file's quoting is not what it looks like.
// A line ends at \n, \r\n or a lone \r (old Mac files), as in Python's csv module and pandas.
#include "data/csv.h"

#include "core/error.h"

namespace soltrain {

bool CsvParser::at_line_end() const {
  return text_[pos_] == '\n' || text_[pos_] == '\r';
}

void CsvParser::skip_line() {
  while (pos_ < text_.size() && !at_line_end()) ++pos_;
  if (pos_ >= text_.size()) return;
  pos_ += text_[pos_] == '\r' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '\n' ? 2 : 1;
  ++line_;
}

bool CsvParser::next(CsvRow& row) {
  row = CsvRow{};
  if (pos_ >= text_.size()) return false;
  row.line = line_;
  if (at_line_end()) {
    row.blank = true;
    skip_line();
    return true;
  }
  CsvField f;
  while (true) {
    if (pos_ < text_.size() && text_[pos_] == '"' && f.value.empty() && !f.quoted) {
      f.quoted = true;
      const size_t open_line = line_;
      ++pos_;
      while (true) {
        if (pos_ >= text_.size()) {
          row.error = cat("a quote opened on line ", open_line, " is never closed");
          return true;
        }
        const char c = text_[pos_];
        if (c == '"') {
          if (pos_ + 1 < text_.size() && text_[pos_ + 1] == '"') {
            f.value += '"';
            pos_ += 2;
            continue;
          }
          ++pos_;
          break;
        }
        if (c == '\n') ++line_;
        f.value += c;
        ++pos_;
      }
      const bool ends = pos_ >= text_.size() || text_[pos_] == delim_ || at_line_end();
      if (!ends) {
        row.error = "text after a closing quote (a quote inside a quoted field is written \"\")";
        skip_line();
        return true;
      }
      continue;
    }
    if (pos_ >= text_.size()) {
      row.fields.push_back(std::move(f));
      return true;
    }
    const char c = text_[pos_];
    if (c == delim_) {
      row.fields.push_back(std::move(f));
      f = CsvField{};
      ++pos_;
    } else if (at_line_end()) {
      row.fields.push_back(std::move(f));
      skip_line();
      return true;
    } else {
      if (f.quoted) {  // unreachable: a closed quote is followed by a delimiter or line break
        row.error = "text after a closing quote";
        skip_line();
        return true;
      }
      f.value += c;
      ++pos_;
    }
  }
}

}  // namespace soltrain
