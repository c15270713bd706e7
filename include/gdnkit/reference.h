// The test oracle: the GDN token recurrence evaluated in fp64 on host tensors.
// Slow (O(L * dk * dv) per sequence and head, one thread): use it on samples.
#pragma once

#include <cstdint>
#include <vector>

#include "gdnkit/gdnkit.h"

namespace gdnkit::reference {

// Runs sequence `seq`, output head `head` of a host problem (Memory::host pointers, the problem's
// strides and dtypes; cu_seqlens read as the problem says). Writes
//   o:           [len, dv] (row t = token cu_seqlens[seq] + t), fp64
//   final_state: [dk, dv] (always kv layout), fp64; the state after the last token.
// Throws Error on metadata the library itself would reject.
void recurrence(const Problem& problem, const Tensors& tensors, std::int64_t seq, int head,
                std::vector<double>& o, std::vector<double>& final_state);

}  // namespace gdnkit::reference
