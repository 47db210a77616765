#include "base/private_dir.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>
#include <vector>

#include <spdlog/fmt/fmt.h>

namespace esi {

namespace {

// The name getpwuid_r or getgrgid_r finds for id, or the number for one the
// system does not know.
template <typename Entry, typename Id, typename Lookup>
std::string nameOf(Id id, Lookup lookup, char* Entry::*name) {
  std::vector<char> buffer(1024);
  Entry entry{};
  Entry* found = nullptr;
  while (lookup(id, &entry, buffer.data(), buffer.size(), &found) == ERANGE) {
    buffer.resize(buffer.size() * 2);
  }
  return found != nullptr ? entry.*name : std::to_string(id);
}

std::string userName(uid_t uid) { return nameOf<passwd>(uid, getpwuid_r, &passwd::pw_name); }

std::string groupName(gid_t gid) { return nameOf<group>(gid, getgrgid_r, &group::gr_name); }

}  // namespace

std::string untrustedDirectory(std::string_view what, const std::string& path,
                               const struct stat& st, uid_t euid, gid_t egid) {
  const bool strangerOwns = st.st_uid != 0 && st.st_uid != euid;
  const bool othersWrite = (st.st_mode & S_IWOTH) != 0;
  // esid's own group is trusted as esid's user is: systemd's directories
  // (RuntimeDirectory=, StateDirectory=) may be esid:esid 0770.
  const bool groupWrites = (st.st_mode & S_IWGRP) != 0 && st.st_gid != egid;
  if (!strangerOwns && !othersWrite && !groupWrites) return {};
  std::vector<std::string> writers;
  if (strangerOwns) writers.emplace_back("its owner");
  if (groupWrites) writers.emplace_back("its group");
  if (othersWrite) writers.emplace_back("every user");
  std::string who = writers.front();
  for (size_t i = 1; i < writers.size(); ++i) {
    who += (i + 1 == writers.size() ? " and " : ", ") + writers[i];
  }
  std::string fix;
  if (strangerOwns) fix = fmt::format("chown {} {}", userName(euid), path);
  if (othersWrite || groupWrites) {
    fix += fmt::format("{}chmod {}{}-w {}", fix.empty() ? "" : "; ", groupWrites ? "g" : "",
                       othersWrite ? "o" : "", path);
  }
  return fmt::format("{} {} is owned by user {}, group {}, mode {:04o}: {} may write in it, but "
                     "what esid keeps there must be esid's alone (esid runs as {}); fix: {}",
                     what, path, userName(st.st_uid), groupName(st.st_gid),
                     st.st_mode & 07777, who, userName(euid), fix);
}

void requirePrivateDirectory(std::string_view what, const std::string& path,
                             const struct stat& st) {
  const std::string why = untrustedDirectory(what, path, st, geteuid(), getegid());
  if (!why.empty()) throw std::runtime_error(why);
}

}  // namespace esi
