// A process's state letter from /proc/PID/stat ('R', 'S', 'T' stopped, 'Z' zombie, ...; 0 when it is gone or
// unreadable): the launcher names a stopped rank, stale partials count a zombie as gone.
#pragma once
#include <sys/types.h>

namespace soltrain {

char process_state(pid_t pid);

}  // namespace soltrain
