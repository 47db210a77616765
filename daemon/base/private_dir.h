// The directories esid creates files in: its socket's and state_dir.  Only
// root and esid's own user may write there: anyone else who could would be
// able to swap esid's files for links between esid's checks and its use of
// them, and have esid (root, perhaps) write or read through them.

#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <string>
#include <string_view>

namespace esi {

// One line saying what is wrong with the directory `path` whose lstat or
// fstat is st, for a process of euid and egid, and how to fix it; "" when
// nobody but root and euid can write in it: owned by root or euid, not
// writable by others, writable by its group only when that is egid.  what
// names it for the operator ("state_dir").
std::string untrustedDirectory(std::string_view what, const std::string& path,
                               const struct stat& st, uid_t euid, gid_t egid);

// Throws std::runtime_error with untrustedDirectory's line for this process.
void requirePrivateDirectory(std::string_view what, const std::string& path,
                             const struct stat& st);

}  // namespace esi
