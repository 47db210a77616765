#include "fleet/state_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "transport/unique_fd.h"

namespace esi {

namespace {

constexpr std::string_view kBlank = " \t\r";

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(kBlank);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kBlank) - first + 1);
}

void writeAll(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::system_error(errno, std::generic_category(), "write " + path);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

StateFile::StateFile(std::string_view dir, std::string_view stream)
    : dir_(dir), stream_(stream) {
  std::string name;
  for (const char c : stream) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    name += plain ? c : '_';
  }
  path_ = dir_ + "/fleet-" + name + ".state";
}

std::string formatState(std::string_view stream, const FleetPosition& position) {
  std::string text = "# esid's position on the fleet's stream (see esid(8), Fleet)\n";
  text += "stream " + std::string(stream) + "\n";
  text += "last " + position.last.text() + "\n";
  if (position.ordinal) text += "ordinal " + std::to_string(*position.ordinal) + "\n";
  return text;
}

FleetPosition parseState(std::string_view text, std::string_view stream, std::string_view name) {
  std::optional<StreamId> last;
  std::optional<uint64_t> ordinal;
  std::string stored;
  size_t lineNumber = 0;
  while (!text.empty()) {
    ++lineNumber;
    const size_t eol = text.find('\n');
    std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    if (const size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const size_t space = line.find_first_of(kBlank);
    const std::string_view key = line.substr(0, space);
    const std::string_view value =
        space == std::string_view::npos ? std::string_view() : trim(line.substr(space));
    const auto bad = [&](const std::string& what) {
      return std::runtime_error(std::string(name) + ":" + std::to_string(lineNumber) + ": " + what);
    };
    if (key == "stream") {
      stored = value;
    } else if (key == "last") {
      last = StreamId::parse(value);
      if (!last) throw bad("\"" + std::string(value) + "\" is not a stream entry ID such as 1700000000000-0");
    } else if (key == "ordinal") {
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || end != value.data() + value.size() || value.empty()) {
        throw bad("ordinal \"" + std::string(value) + "\" is not a number");
      }
      ordinal = n;
    } else {
      throw bad("unknown key \"" + std::string(key) + "\" (known: stream, last, ordinal)");
    }
  }
  if (!last) throw std::runtime_error(std::string(name) + ": no \"last\" line");
  if (stored != stream) {
    throw std::runtime_error(std::string(name) + ": the position of stream \"" + stored +
                             "\", not of \"" + std::string(stream) + "\"");
  }
  return FleetPosition{*last, ordinal};
}

std::optional<FleetPosition> StateFile::load() const {
  std::ifstream in(path_, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return std::nullopt;
    throw std::runtime_error("cannot read " + path_ + ": " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw std::runtime_error("cannot read " + path_ + ": " + std::strerror(errno));
  return parseState(text.str(), stream_, path_);
}

void StateFile::save(const FleetPosition& position) const {
  const std::string temporary = path_ + ".tmp";
  {
    UniqueFd fd(open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) throw std::system_error(errno, std::generic_category(), "create " + temporary);
    writeAll(fd.get(), formatState(stream_, position), temporary);
    if (fsync(fd.get()) != 0) throw std::system_error(errno, std::generic_category(), "fsync " + temporary);
  }
  if (rename(temporary.c_str(), path_.c_str()) != 0) {
    throw std::system_error(errno, std::generic_category(), "rename " + temporary);
  }
  // The rename itself survives a power cut only once the directory is on disk.
  UniqueFd dir(open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir) fsync(dir.get());
}

}  // namespace esi
