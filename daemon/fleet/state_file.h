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
//     zone pages               # a zone this node's NGINX served: its entries
//                              # wait while no worker serves it (one line each)
//
// state_dir must be esid's alone (private_dir.h), and esid opens it once and
// names its files relative to it; it never follows a link there, whether at
// the file's name or at a temporary's.

#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "fleet/entry.h"
#include "base/unique_fd.h"

namespace esi {

struct FleetPosition {
  StreamId last;
  // The entry's ordinal (entries-added when it was the newest); nullopt
  // when not known (a hand-set position): gaps are then not detected until
  // the node has read to the stream's end once.
  std::optional<uint64_t> ordinal;
};

// What a node keeps: its position, and the zones its NGINX served (an entry
// for one of them waits while NGINX is away, never skipped).
struct FleetState {
  FleetPosition position;
  std::set<std::string> zones;
};

class StateFile {
 public:
  // The file for this stream in dir: fleet-STREAM.state, with every byte
  // of the stream's name outside [A-Za-z0-9._-] written as '_'.  Makes dir
  // (0750) when it is missing.  Throws std::runtime_error when dir cannot be
  // opened or written, is a link, or others than root and esid may write in
  // it.
  StateFile(const std::string& dir, std::string_view stream);

  // The state stored, or nullopt when there is no file yet.  Throws
  // std::runtime_error when the file cannot be read or does not parse, or
  // names another stream: esid must not guess where it is; or when it is
  // not a regular file of one link (then without a word of its content).
  std::optional<FleetState> load() const;

  // Writes a new file (mode 0600) under a name of its own and renames it
  // over the old.  Throws std::system_error when the state cannot be
  // written.
  void save(const FleetState& state) const;

  const std::string& path() const { return path_; }

 private:
  std::string dirPath_;
  UniqueFd dir_;
  std::string stream_;
  std::string name_;
  std::string path_;
  // Tells this process's temporaries apart; a name taken is skipped.
  mutable uint64_t saves_ = 0;
};

// The text of a state file, and back; parse throws std::runtime_error.
std::string formatState(std::string_view stream, const FleetState& state);
FleetState parseState(std::string_view text, std::string_view stream, std::string_view name);

}  // namespace esi
