// Where an expert-parallel group runs each expert's rows. Natively expert e runs on rank e / (E / P), the rank
// that owns it. Least-Loaded Expert Parallelism (LLEP: Nguyen et al. 2026, arXiv 2601.17111, its Algorithm 2 "LLA"
// with the "LLAS" spill rule) moves rows of the busiest experts to the least loaded ranks when the native
// placement is imbalanced, so every rank finishes its grouped GEMMs at about the same time; the sum each token
// gets is the same, only where its experts run changes.
//
// An expert's rows are counted in one global order: rank 0's rows of that expert first, then rank 1's, ...;
// a chunk [begin, end) of that order runs on one rank.
#pragma once
#include <cstdint>
#include <vector>

namespace soltrain {

struct ExpertChunk {
  int rank = 0;
  int64_t begin = 0, end = 0;
  bool operator==(const ExpertChunk&) const = default;
};
// Per expert, its chunks in order (covering [0, rows) exactly; none for an expert with no rows).
using ExpertPlacement = std::vector<std::vector<ExpertChunk>>;

// LLEP's settings (TrainConfig's ep_llep*): the paper's λ, α and m.
struct LoadBalance {
  bool on = false;
  double threshold = 1.3;   // λ: re-place only when the native placement's max/mean rank load is above this
  double capacity = 1.1;    // α: a rank takes at most α · (the group's rows / P) before rows spill elsewhere
  int64_t min_rows = 1024;  // m: a spilled chunk smaller than this goes to the next rank instead (LLAS)
};

// Every expert's rows on its owner. `rows`: the group's rows per expert (E), `ranks`: P (dividing E).
ExpertPlacement native_placement(const std::vector<int64_t>& rows, int ranks);
// A placement's balance: the busiest rank's rows over the mean (1 when there are none).
double placement_imbalance(const ExpertPlacement& p, int ranks);
// LLA: the experts in decreasing load (ties by index). Each fills its owner up to the capacity left there after
// what is assigned to it and its native experts not yet placed (the "pending" load); the rest spills to the other
// ranks in increasing effective load (assigned + pending): a chunk as large as the rank's room, a rank skipped when
// that room is under min_rows while more rows remain, and all the rest forced onto the least loaded when no rank
// takes it. (The room is recomputed for each chunk, as the paper's pseudocode does.)
ExpertPlacement least_loaded_placement(const std::vector<int64_t>& rows, int ranks, double capacity, int64_t min_rows);
// Rows each rank runs under a placement.
std::vector<int64_t> placement_loads(const ExpertPlacement& p, int ranks);

}  // namespace soltrain
