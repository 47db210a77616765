// WorkerSession: the variant index's feed (the connector's
// ngx_http_esi_purge_index.c): the zones a worker serves, the files it
// stores, and the files a purge removed that it must forget.

#include "transport/worker_session.h"

#include <algorithm>

#include <capnp/message.h>

#include "esi.capnp.h"
#include "transport/worker_session_wire.h"

namespace esi {

using namespace session;  // worker_session_wire.h

namespace {

// Files per Response.forget (16 KiB); a purge of more tells each worker to
// forget every object it keeps (it keeps at most 1,024 plain ones).
constexpr size_t kForgetFiles = 1024;
// esi_purge_tag_headers, all of its names.
constexpr size_t kMaxTagHeadersBytes = 4096;

// A zone's directory must be absolute and plainly named: esid reads below
// it on a worker's word.
bool plainAbsolutePath(std::string_view path) {
  if (path.empty() || path.front() != '/') return false;
  for (size_t at = 0; at != std::string_view::npos;) {
    const size_t next = path.find('/', at + 1);
    const std::string_view segment = path.substr(at + 1, next == std::string_view::npos ? next : next - at - 1);
    if (segment == "." || segment == "..") return false;
    at = next;
  }
  return path.find('\0') == std::string_view::npos;
}

}  // namespace

bool WorkerSession::handleZone(wire::Zone::Reader zone) {
  auto name = zone.getName();
  auto path = zone.getPath();
  if (name.size() == 0 || tooLong(name, kMaxOpenFieldBytes) || tooLong(path, kMaxOpenFieldBytes) ||
      !plainAbsolutePath(std::string_view(path.cStr(), path.size()))) {
    violation("zone: bad name or path");
    return false;
  }
  auto names = zone.getTagHeaders();
  if (tooLong(names, kMaxTagHeadersBytes)) {
    violation("zone: tag headers too long");
    return false;
  }
  std::vector<std::string> tagHeaders;
  splitTags(std::string_view(names.cStr(), names.size()), tagHeaders);
  purger_.announce(std::string_view(name.cStr(), name.size()),
                   std::string_view(path.cStr(), path.size()), zone.getIndexBytes(),
                   zone.getLostReports(), std::move(tagHeaders));
  zones_.emplace(name.cStr(), name.size());
  if (!stopped_) orders_.serves(std::string_view(name.cStr(), name.size()), this);
  return true;
}

bool WorkerSession::handleStored(wire::Stored::Reader stored) {
  auto zone = stored.getZone();
  auto key = stored.getKey();
  auto file = stored.getFile();
  auto tags = stored.getTags();
  if (file.size() != sizeof(Md5) || tooLong(zone, kMaxOpenFieldBytes) ||
      tooLong(key, kMaxKeyBytes) || tooLong(tags, kMaxKeyBytes)) {
    violation("stored: bad file name, key or tags");
    return false;
  }
  StoredFile record;
  record.key.assign(key.cStr(), key.size());
  record.main = md5Of(record.key);
  std::copy(file.begin(), file.end(), record.file.begin());
  std::string_view rest(tags.cStr(), tags.size());
  while (!rest.empty()) {
    const size_t start = rest.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    const size_t end = rest.find(' ', start);
    record.tags.emplace_back(rest.substr(start, end == std::string_view::npos ? end : end - start));
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end);
  }
  purger_.stored(std::string_view(zone.cStr(), zone.size()), std::move(record));
  return true;
}

void WorkerSession::sendForget(const std::vector<Md5>& files) {
  // An identity a worker keeps is never that of a later store, so a lost
  // forget costs memory for a second, never a wrong byte.
  if (stopped_ || pending_.size() >= kMaxPendingAnswers) return;
  const size_t listed = files.size() <= kForgetFiles ? files.size() : 0;
  capnp::MallocMessageBuilder message(listed * 2 + 16);
  auto response = message.initRoot<wire::Response>();
  response.setStream(0);
  auto forget = response.initForget(static_cast<unsigned>(listed * sizeof(Md5)));
  for (size_t i = 0; i < listed; ++i) {
    std::copy(files[i].begin(), files[i].end(), forget.begin() + i * sizeof(Md5));
  }
  send(message);
}

}  // namespace esi
