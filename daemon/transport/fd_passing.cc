#include "transport/fd_passing.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace esi {

namespace {

// Room for CMSG_SPACE(bytes), aligned as the control messages in it must be.
std::vector<cmsghdr> controlBuffer(size_t bytes) {
  const size_t space = CMSG_SPACE(bytes);
  return std::vector<cmsghdr>((space + sizeof(cmsghdr) - 1) / sizeof(cmsghdr));
}

}  // namespace

bool sendWithFds(int socket, std::span<const std::byte> bytes,
                 std::span<const int> fds) {
  iovec iov{const_cast<std::byte*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<cmsghdr> control;
  if (!fds.empty()) {
    const size_t fdBytes = fds.size_bytes();
    control = controlBuffer(fdBytes);
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(fdBytes);
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fdBytes);
    std::memcpy(CMSG_DATA(cmsg), fds.data(), fdBytes);
  }
  ssize_t sent;
  do {
    sent = sendmsg(socket, &msg, MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  return sent == static_cast<ssize_t>(bytes.size());
}

std::optional<MessageWithFds> receiveWithFds(int socket,
                                             std::span<std::byte> buffer,
                                             size_t maxFds) {
  std::vector<cmsghdr> control = controlBuffer(maxFds * sizeof(int));
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = CMSG_SPACE(maxFds * sizeof(int));
  ssize_t received;
  do {
    received = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC);
  } while (received < 0 && errno == EINTR);
  if (received < 0) return std::nullopt;

  // Own every fd that arrived first, so that a refusal closes them all.
  MessageWithFds message{static_cast<size_t>(received), {}};
  bool foreign = false;
  for (cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) {
      foreign = true;
      continue;
    }
    const size_t count = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const unsigned char* data = CMSG_DATA(cmsg);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, data + i * sizeof(int), sizeof(int));
      message.fds.emplace_back(fd);
    }
  }
  if ((msg.msg_flags & MSG_CTRUNC) != 0 || message.fds.size() > maxFds) {
    errno = EMSGSIZE;
    return std::nullopt;
  }
  if (foreign) {
    errno = EBADMSG;
    return std::nullopt;
  }
  return message;
}

}  // namespace esi
