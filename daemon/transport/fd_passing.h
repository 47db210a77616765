// File descriptors passed over a Unix socket: one message and its fds in
// one sendmsg() or recvmsg() with SCM_RIGHTS, as esid hands a worker its
// rings, eventfds and segment arena with the Welcome (proto/README.md).
//
// The receiving side validates what the kernel handed it: every fd that
// arrived is owned by a UniqueFd before anything is checked, so a message
// that is refused (control data cut short, a control message other than
// SCM_RIGHTS, more fds than asked for) leaves none open.

#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "base/unique_fd.h"

namespace esi {

// Sends `bytes` with `fds` attached, MSG_NOSIGNAL.  True when every byte
// went out; false otherwise, with errno set if sendmsg() failed.  Meant
// for a socket that is otherwise idle, where a short message goes out
// whole or not at all.
bool sendWithFds(int socket, std::span<const std::byte> bytes,
                 std::span<const int> fds);

struct MessageWithFds {
  size_t size = 0;  // bytes read into the buffer; 0: the peer closed
  std::vector<UniqueFd> fds;  // in the order they were sent, close-on-exec
};

// Reads one message of at most `buffer.size()` bytes and at most `maxFds`
// fds.  Nothing (and errno set) when recvmsg() failed (errno from it), the
// control data was cut short or more than `maxFds` fds came (EMSGSIZE), or
// a control message was not SCM_RIGHTS (EBADMSG); whatever fds arrived
// with a refused message are closed.
std::optional<MessageWithFds> receiveWithFds(int socket,
                                             std::span<std::byte> buffer,
                                             size_t maxFds);

}  // namespace esi
