// sendWithFds and receiveWithFds over a real socketpair.

#include "transport/fd_passing.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <iterator>
#include <string_view>

#include <gtest/gtest.h>

namespace esi {
namespace {

// The fds this process has open (and the one that lists them).
std::ptrdiff_t openFds() {
  std::filesystem::directory_iterator fds("/proc/self/fd");
  return std::distance(begin(fds), end(fds));
}

std::span<const std::byte> bytesOf(std::string_view text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

bool sameFile(int a, int b) {
  struct stat sa;
  struct stat sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

class FdPassingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    sender_.reset(pair[0]);
    receiver_.reset(pair[1]);
    for (size_t i = 0; i < files_.size(); ++i) {
      files_[i].reset(memfd_create("fd-passing-test", MFD_CLOEXEC));
      ASSERT_TRUE(files_[i]);
      fds_[i] = files_[i].get();
    }
  }

  UniqueFd sender_;
  UniqueFd receiver_;
  std::array<UniqueFd, 3> files_;
  std::array<int, 3> fds_{};  // files_'
  std::array<std::byte, 64> buffer_{};
};

TEST_F(FdPassingTest, FdsArriveInOrderAndReferToTheSameFiles) {
  const std::array<int, 3>& sent = fds_;
  ASSERT_TRUE(sendWithFds(sender_.get(), bytesOf("welcome"), sent));
  auto message = receiveWithFds(receiver_.get(), buffer_, 3);
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(std::string_view(reinterpret_cast<const char*>(buffer_.data()),
                             message->size),
            "welcome");
  ASSERT_EQ(message->fds.size(), 3u);
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_NE(message->fds[i].get(), sent[i]);
    EXPECT_TRUE(sameFile(message->fds[i].get(), sent[i])) << "fd " << i;
    EXPECT_TRUE(fcntl(message->fds[i].get(), F_GETFD) & FD_CLOEXEC);
  }
  // What is written through one end is read through the other.
  ASSERT_EQ(write(sent[1], "x", 1), 1);
  struct stat st;
  ASSERT_EQ(fstat(message->fds[1].get(), &st), 0);
  EXPECT_EQ(st.st_size, 1);
}

TEST_F(FdPassingTest, FewerFdsThanAllowedArriveAsSent) {
  const std::array<int, 3>& sent = fds_;
  ASSERT_TRUE(sendWithFds(sender_.get(), bytesOf("two"),
                          std::span(sent).first(2)));
  auto message = receiveWithFds(receiver_.get(), buffer_, 4);
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(message->size, 3u);
  ASSERT_EQ(message->fds.size(), 2u);
  EXPECT_TRUE(sameFile(message->fds[1].get(), sent[1]));
}

TEST_F(FdPassingTest, AMessageWithoutFdsArrivesWithNone) {
  ASSERT_TRUE(sendWithFds(sender_.get(), bytesOf("plain"), {}));
  auto message = receiveWithFds(receiver_.get(), buffer_, 4);
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(message->size, 5u);
  EXPECT_TRUE(message->fds.empty());
}

TEST_F(FdPassingTest, AClosedPeerReadsAsAnEmptyMessage) {
  sender_.reset();
  auto message = receiveWithFds(receiver_.get(), buffer_, 4);
  ASSERT_TRUE(message.has_value());
  EXPECT_EQ(message->size, 0u);
  EXPECT_TRUE(message->fds.empty());
}

TEST_F(FdPassingTest, SendingOnAClosedSocketFailsWithoutASignal) {
  receiver_.reset();
  errno = 0;
  EXPECT_FALSE(sendWithFds(sender_.get(), bytesOf("lost"), fds_));
  EXPECT_EQ(errno, EPIPE);
}

// Sends `sent` of the files and receives with room for `maxFds`: refused,
// EMSGSIZE, and no fd left open by the attempt.
void expectRefusedAndClosed(int sender, int receiver, std::span<const int> sent,
                            size_t maxFds) {
  ASSERT_TRUE(sendWithFds(sender, bytesOf("too many"), sent));
  std::array<std::byte, 64> buffer{};
  const std::ptrdiff_t before = openFds();
  errno = 0;
  EXPECT_FALSE(receiveWithFds(receiver, buffer, maxFds).has_value());
  EXPECT_EQ(errno, EMSGSIZE);
  EXPECT_EQ(openFds(), before);
}

// Three fds against a control buffer for one: the kernel installs those that
// fit (two: CMSG_SPACE pads), says MSG_CTRUNC, and they must be closed.
TEST_F(FdPassingTest, TruncatedControlDataIsRefusedAndWhatArrivedIsClosed) {
  expectRefusedAndClosed(sender_.get(), receiver_.get(), fds_, 1);
}

// Two fds against room for one: CMSG_SPACE's padding holds the second, so
// the control data is whole, and the count alone says it is too many.
TEST_F(FdPassingTest, MoreFdsThanAskedAreRefusedAndClosed) {
  expectRefusedAndClosed(sender_.get(), receiver_.get(),
                         std::span(fds_).first(2), 1);
}

TEST_F(FdPassingTest, AnFdWhereNoneIsAskedForIsRefused) {
  expectRefusedAndClosed(sender_.get(), receiver_.get(),
                         std::span(fds_).first(1), 0);
}

// With SO_PASSCRED the kernel adds SCM_CREDENTIALS to every message: not
// what a receiver of fds expects.
TEST_F(FdPassingTest, AControlMessageOtherThanFdsIsRefused) {
  const int on = 1;
  ASSERT_EQ(setsockopt(receiver_.get(), SOL_SOCKET, SO_PASSCRED, &on,
                       sizeof(on)),
            0);
  ASSERT_TRUE(sendWithFds(sender_.get(), bytesOf("creds"), {}));
  errno = 0;
  EXPECT_FALSE(receiveWithFds(receiver_.get(), buffer_, 4).has_value());
  EXPECT_EQ(errno, EBADMSG);
}

}  // namespace
}  // namespace esi
