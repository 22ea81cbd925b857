#pragma once

#include <iosfwd>

namespace kvoffload::replay {

/// Replays a trace (shared trace-format v1): reads JSON lines from `in`, writes one answer
/// line per answering op to `out`. Returns the exit status: 0 done, 1 the library rejected an
/// op (an {"op":"error",...} line was written), 2 a malformed trace ("kvoffload-replay: line N:
/// ..." on `err`).
/// With `stats`, a summary of the scheduler's and manager's counters goes to `err` at the end.
int run(std::istream& in, std::ostream& out, std::ostream& err, bool stats = false);

}  // namespace kvoffload::replay
