// esid logs to stderr.  Under systemd, whose journal stamps and attributes
// every line itself, each line instead starts with its syslog priority
// ("<4>" for a warning, sd-daemon(3)), so `journalctl -p warning -u esid`
// filters by level.

#pragma once

#include <spdlog/common.h>

namespace esi {

// Installs the default logger on stderr at `level`.
void setUpLogging(spdlog::level::level_enum level);

// True when stderr is the journal stream systemd named in $JOURNAL_STREAM.
bool stderrIsJournal();

}  // namespace esi
