// A ledger of what Ops::alloc hands out (the device's memory; on the CPU backend, host memory standing in for
// it): the bytes held now and the most held at once in this process. A ZeRO-3 rank reports the most it held
// while loading, so a test sees it never held the whole model; allocations are few (the step allocates
// nothing), so one lock costs nothing.
#pragma once
#include <cstddef>

namespace soltrain {

struct DeviceMemory {
  size_t live = 0, peak = 0;
};
void device_allocated(void* p, size_t bytes);
void device_freed(void* p);  // (unknown pointers are ignored)
DeviceMemory device_memory();
void reset_device_peak();  // the peak from here on: what is held now

}  // namespace soltrain
