#include "base/private_dir.h"

#include <gtest/gtest.h>

#include <string>

namespace esi {
namespace {

// uids and gids no system has, shown as numbers.
constexpr uid_t kEsid = 54320;
constexpr uid_t kStranger = 54321;
constexpr gid_t kEsidGroup = 54320;
constexpr gid_t kOtherGroup = 54322;

struct stat dir(uid_t uid, gid_t gid, mode_t mode) {
  struct stat st{};
  st.st_uid = uid;
  st.st_gid = gid;
  st.st_mode = S_IFDIR | mode;
  return st;
}

std::string why(uid_t uid, gid_t gid, mode_t mode) {
  return untrustedDirectory("state_dir", "/d", dir(uid, gid, mode), kEsid, kEsidGroup);
}

TEST(PrivateDirectory, RootsOrEsidsWithNoOtherWriterIsTaken) {
  EXPECT_EQ(why(0, 0, 0755), "");
  EXPECT_EQ(why(kEsid, kEsidGroup, 0750), "");
  EXPECT_EQ(why(kEsid, kOtherGroup, 0755), "");
  // esid's own group may write: systemd's StateDirectory= of User=esid.
  EXPECT_EQ(why(kEsid, kEsidGroup, 0770), "");
  EXPECT_EQ(why(0, kEsidGroup, 02770), "");
}

TEST(PrivateDirectory, AnyOtherWriterIsNamedWithTheFix) {
  EXPECT_EQ(why(0, kEsidGroup, 01777),
            "state_dir /d is owned by user root, group 54320, mode 1777: every user may write "
            "in it, but what esid keeps there must be esid's alone (esid runs as 54320); "
            "fix: chmod o-w /d");
  EXPECT_EQ(why(kEsid, kOtherGroup, 0770),
            "state_dir /d is owned by user 54320, group 54322, mode 0770: its group may write "
            "in it, but what esid keeps there must be esid's alone (esid runs as 54320); "
            "fix: chmod g-w /d");
  EXPECT_EQ(why(kStranger, kEsidGroup, 0700),
            "state_dir /d is owned by user 54321, group 54320, mode 0700: its owner may write "
            "in it, but what esid keeps there must be esid's alone (esid runs as 54320); "
            "fix: chown 54320 /d");
  EXPECT_EQ(why(kStranger, kOtherGroup, 0777),
            "state_dir /d is owned by user 54321, group 54322, mode 0777: its owner, its group "
            "and every user may write in it, but what esid keeps there must be esid's "
            "alone (esid runs as 54320); fix: chown 54320 /d; chmod go-w /d");
}

}  // namespace
}  // namespace esi
