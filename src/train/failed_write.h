// A log write that fails mid-run (a full disk) stops the run, but first tries to save a checkpoint so the
// steps trained so far are kept; the one error line says whether that worked.
#pragma once
#include <string>

#include "core/error.h"

namespace soltrain {

template <typename Write, typename Save>
void write_or_save_and_stop(Write&& write, Save&& save) {
  try {
    write();
  } catch (const UserError& e) {
    std::string saved;
    try {
      save();
      saved = "a checkpoint of the steps so far was saved";
    } catch (const UserError& e2) {
      saved = cat("saving a checkpoint failed too (", e2.what(), ")");
    }
    user_error(e.what(), "; training stopped: ", saved);
  }
}

}  // namespace soltrain
