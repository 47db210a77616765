// Where on the fleet's stream this node is: the last entry it applied, kept
// in state_dir so that a node that was down replays what it missed.  The
// file is a few "key value" lines, written whole to a temporary file and
// renamed over the old one, so a crash leaves the old position or the new,
// never half of one.  An operator may edit it by hand (stop esid first):
//
//     stream esi:purges
//     last 1796172032767-0     # the last entry applied
//     ordinal 6                # which entry that was, counting from the
//                              # stream's first; remove it with a hand-set last

#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fleet/entry.h"

namespace esi {

struct FleetPosition {
  StreamId last;
  // The entry's ordinal (entries-added when it was the newest); nullopt
  // when not known (a hand-set position): gaps are then not detected until
  // the node has read to the stream's end once.
  std::optional<uint64_t> ordinal;
};

class StateFile {
 public:
  // The file for this stream in dir: fleet-STREAM.state, with every byte
  // of the stream's name outside [A-Za-z0-9._-] written as '_'.
  StateFile(std::string_view dir, std::string_view stream);

  // The position stored, or nullopt when there is no file yet.  Throws
  // std::runtime_error when the file cannot be read or does not parse, or
  // names another stream: esid must not guess where it is.
  std::optional<FleetPosition> load() const;

  // Throws std::system_error when the position cannot be written.
  void save(const FleetPosition& position) const;

  const std::string& path() const { return path_; }

 private:
  std::string dir_;
  std::string stream_;
  std::string path_;
};

// The text of a state file, and back; parse throws std::runtime_error.
std::string formatState(std::string_view stream, const FleetPosition& position);
FleetPosition parseState(std::string_view text, std::string_view stream, std::string_view name);

}  // namespace esi
