#include "fleet/state_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "base/text.h"
#include "base/private_dir.h"

namespace esi {

namespace {

constexpr std::string_view kBlank = " \t\r";

// Names of one save() that are taken (a crashed run's, say) before one is free.
constexpr int kTemporaryAttempts = 100;

// A temporary save() made, removed unless it was renamed into place.
struct Temporary {
  int dir;
  std::string name;
  ~Temporary() {
    if (!name.empty()) unlinkat(dir, name.c_str(), 0);
  }
};

// fleet-STREAM.state, with every byte of the stream's name outside
// [A-Za-z0-9._-] written as '_'.
std::string fileName(std::string_view stream) {
  std::string name = "fleet-";
  for (const char c : stream) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    name += plain ? c : '_';
  }
  return name + ".state";
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

StateFile::StateFile(const std::string& dir, std::string_view stream)
    : dirPath_(dir), stream_(stream), name_(fileName(stream)), path_(dir + "/" + name_),
      saves_(std::random_device()()) {
  if (mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) {
    throw std::runtime_error("state_dir " + dir + " does not exist and cannot be created: " +
                             std::strerror(errno));
  }
  // Opened once, not through a link: the file's names are relative to the
  // directory checked here, whatever its path names later.
  dir_.reset(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st;
  if (!dir_) {
    const int error = errno;
    if (lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      throw std::runtime_error("state_dir " + dir + " is a symbolic link: name the directory itself");
    }
    throw std::runtime_error("cannot open state_dir " + dir + ": " + std::strerror(error));
  }
  if (fstat(dir_.get(), &st) != 0) {
    throw std::runtime_error("cannot stat state_dir " + dir + ": " + std::strerror(errno));
  }
  requirePrivateDirectory("state_dir", dir, st);
  if (faccessat(dir_.get(), ".", W_OK, AT_EACCESS) != 0) {
    throw std::runtime_error("state_dir " + dir + " is not writable by esid");
  }
}

std::string formatState(std::string_view stream, const FleetState& state) {
  std::string text = "# esid's position on the fleet's stream (see esid(8), Fleet)\n";
  text += "stream " + std::string(stream) + "\n";
  text += "last " + state.position.last.text() + "\n";
  if (state.position.ordinal) text += "ordinal " + std::to_string(*state.position.ordinal) + "\n";
  for (const std::string& zone : state.zones) {
    // A name this file could not read back is not kept (NGINX's are plain).
    if (zone.find_first_of("#\n \t\r") == std::string::npos) text += "zone " + zone + "\n";
  }
  return text;
}

FleetState parseState(std::string_view text, std::string_view stream, std::string_view name) {
  std::optional<StreamId> last;
  std::optional<uint64_t> ordinal;
  std::set<std::string> zones;
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
    } else if (key == "zone") {
      if (value.empty()) throw bad("zone without a name");
      zones.emplace(value);
    } else {
      throw bad("unknown key \"" + std::string(key) + "\" (known: stream, last, ordinal, zone)");
    }
  }
  if (!last) throw std::runtime_error(std::string(name) + ": no \"last\" line");
  if (stored != stream) {
    throw std::runtime_error(std::string(name) + ": the position of stream \"" + stored +
                             "\", not of \"" + std::string(stream) + "\"");
  }
  return FleetState{FleetPosition{*last, ordinal}, std::move(zones)};
}

std::optional<FleetState> StateFile::load() const {
  // Non-blocking: a FIFO there must not hang esid before it is refused.
  UniqueFd fd(openat(dir_.get(), name_.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    if (errno == ELOOP) {
      throw std::runtime_error(path_ + " is a symbolic link, which esid does not follow: "
                               "remove it (esid writes a new file)");
    }
    throw std::runtime_error("cannot read " + path_ + ": " + std::strerror(errno));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    throw std::runtime_error("cannot stat " + path_ + ": " + std::strerror(errno));
  }
  // A hard link to some other file would have its lines quoted in errors.
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1) {
    throw std::runtime_error(path_ + " is not a regular file of one link, which esid does not "
                             "read: remove it (esid writes a new file)");
  }
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error("cannot read " + path_ + ": " + std::strerror(errno));
    if (n == 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  return parseState(text, stream_, path_);
}

void StateFile::save(const FleetState& state) const {
  // A name of its own, created here: never an existing file or a link.
  Temporary temporary{dir_.get(), {}};
  UniqueFd fd;
  for (int attempt = 1; !fd; ++attempt) {
    temporary.name = name_ + ".tmp-" + std::to_string(getpid()) + "-" + std::to_string(saves_++);
    fd.reset(openat(dir_.get(), temporary.name.c_str(),
                    O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd && (errno != EEXIST || attempt == kTemporaryAttempts)) {
      const int error = errno;
      const std::string name = dirPath_ + "/" + std::exchange(temporary.name, {});
      throw std::system_error(error, std::generic_category(), "create " + name);
    }
  }
  const std::string shown = dirPath_ + "/" + temporary.name;
  writeAll(fd.get(), formatState(stream_, state), shown);
  if (fsync(fd.get()) != 0) throw std::system_error(errno, std::generic_category(), "fsync " + shown);
  if (renameat(dir_.get(), temporary.name.c_str(), dir_.get(), name_.c_str()) != 0) {
    throw std::system_error(errno, std::generic_category(), "rename " + shown);
  }
  temporary.name.clear();
  // The rename itself survives a power cut only once the directory is on disk.
  fsync(dir_.get());
}

}  // namespace esi
