#include "base/text.h"

#include <gtest/gtest.h>

namespace esi {
namespace {

TEST(Trim, BlanksAroundGoInsideStay) {
  EXPECT_EQ(trim(" \t a b \r\n"), "a b");
  EXPECT_EQ(trim("a"), "a");
  EXPECT_EQ(trim("a\tb"), "a\tb");
}

TEST(Trim, OnlyBlanksIsEmpty) {
  EXPECT_EQ(trim(""), "");
  EXPECT_EQ(trim(" \t\r\n"), "");
}

}  // namespace
}  // namespace esi
